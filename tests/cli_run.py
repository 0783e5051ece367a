"""The config of the everyday CLI tests (two pairs of the example prompts, tiny GPT-2, vanilla
and LIDAO-min, the gender and VADER scorers) and a copy of the run they share (the
`everyday_run` fixture, tests/conftest.py) for a test that changes it; `run_python` and
`harness`, a child Python process started from the checkout; `run_here`, `run` in this process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "examples" / "data"
PAIR_FILES = {g: str(PAIRS / f"pairs-{g}.jsonl") for g in ("female", "male")}  # paired-jsonl


def config(tmp_path: Path, **changes: object) -> Path:
    data: dict[str, object] = {
        "name": "everyday",
        "dataset": {
            "kind": "paired-jsonl",
            "files": dict(PAIR_FILES),
            "limit": 2,
        },
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla", "lidao-min"],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 3},
        "scorers": ["gender", "sentiment-vader"],
        **changes,
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(data))
    return path


def copy_run(everyday_run: tuple[Path, str, str], tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(everyday_run[0], dst)
    return dst


def run_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = REPO,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a child process, its output captured as text. `env`: the child's whole
    environment (default: this process's, with PYTHONPATH the checkout)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=dict(env) if env is not None else {**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def harness(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = REPO,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`python -m harness ARGS` (`run_python`)."""
    return run_python(["-m", "harness", *args], env=env, cwd=cwd, timeout=timeout)


def run_here(tmp_path: Path, cfg: dict[str, Any]) -> Any:
    """`run` of `cfg` (written to tmp_path/cfg.yaml) in this process, without Ray or bars, into
    tmp_path/run, which must succeed; its generation rows (a polars DataFrame)."""
    import yaml

    from harness.cli.commands import main
    from results.run.store import RunStore

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--no-ray", "--no-progress"]) == 0
    return RunStore(str(out)).read_generations()

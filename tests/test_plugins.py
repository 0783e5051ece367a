"""The example plugin (examples/plugin): installed with pip, found through its entry points,
its method and scorer run through the CLI on local Ray (actors import them too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_example_plugin_installs_and_runs_through_the_cli(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO / "examples" / "plugin", src)  # the build writes beside the sources
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    res = subprocess.run(
        [*pip, "--no-index", "--target", str(target), str(src)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    pairs = REPO / "examples" / "data"
    cfg = {
        "name": "plugin",
        "dataset": {
            "kind": "paired-jsonl",
            "files": {g: str(pairs / f"pairs-{g}.jsonl") for g in ("female", "male")},
            "limit": 1,
        },
        "models": [{"id": "tiny-random/gpt2", "name": "tiny"}],
        "methods": ["vanilla", {"name": "boost-word", "params": {"strength": 50.0}}],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 4},
        "scorers": ["gender", "sentiment-wordlist"],
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{REPO}", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "harness", *args]
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    listed = cli("list", "methods")
    assert "boost-word  (lidao_plugin_example.method:BoostWord)" in listed.stdout, listed.stderr
    assert "    strength: float = 2.0" in listed.stdout
    scorers = cli("list", "scorers")
    assert (
        "sentiment-wordlist  (metric sentiment; lidao_plugin_example.scorer:WordListSentiment)"
        in scorers.stdout
    ), scorers.stderr
    assert "    text_field: str = continuation" in scorers.stdout
    bad = dict(cfg, methods=[{"name": "boost-word", "params": {"strength": "lots"}}])
    path.write_text(json.dumps(bad))
    refused = cli("validate", str(path))
    assert (
        refused.returncode == 2
        and "parameter strength = 'lots': must be a number" in refused.stderr
    )
    path.write_text(json.dumps(cfg))
    out = tmp_path / "run"
    ran = cli("run", str(path), "--out", str(out), "--no-progress")  # on a fresh local Ray
    assert ran.returncode == 0, ran.stderr[-3000:]
    gens = pl.read_parquet(out / "generations" / "*.parquet")
    boosted = gens.filter(pl.col("method") == "boost-word")
    assert boosted.height == 2 and (boosted["status"] == "ok").all()
    # +50 on one logit: every sampled token is that word
    assert all(t.split() == ["the"] * 4 for t in boosted["continuation"]), boosted["continuation"]
    vanilla = gens.filter(pl.col("method") == "vanilla")["continuation"].to_list()
    assert not all(t.split() == ["the"] * 4 for t in vanilla)
    scores = pl.read_parquet(out / "scores" / "sentiment-wordlist" / "*.parquet")
    assert scores.height == 4 and scores["sentiment"].is_between(0, 1).all()
    status = cli("status", str(out))
    assert "  sentiment-wordlist: ok 4; missing 0" in status.stdout, status.stdout
    assert f"report (report/index.html): {out / 'report' / 'index.html'}" in status.stdout

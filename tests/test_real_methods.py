"""The `real` tier on SmolLM2 (tests/real_models.py): every method generates with its defaults
and keeps the text fluent (mean perplexity, scored by SmolLM2 itself, within 3× vanilla's on the
same prompts and seeds); the quickstart validates and runs; its shipped sentiment head is
re-made from a small run of SmolLM2's own text and learns it.

GeDi's class-conditional LM and DExperts' experts must share SmolLM2's tokenizer; offline the
only such LM is SmolLM2 itself, so GeDi runs it as its own conditional model and DExperts with
expert = anti-expert (a no-op, as examples/smollm2-methods.yaml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobs.spec import GenerationParams, JobSpec, ModelRef
from tests.real_models import SMOLLM2

pytestmark = pytest.mark.real
REPO = Path(__file__).resolve().parents[1]
HEAD = REPO / "examples" / "heads" / "smollm2-135m-sentiment.safetensors"
GEN = GenerationParams(max_new_tokens=10, top_p=0.9, temperature=1.0, repetition_penalty=1.0)
SEEDS = (0, 1)
RATIO = 3.0  # the margin: a method's mean perplexity at most 3× vanilla's (issue 38)


def _prompts(n: int = 2) -> list[tuple[str, str]]:
    """(group, text) of the first `n` example pairs."""
    out = []
    for group in ("female", "male"):
        lines = (REPO / "examples" / "data" / f"pairs-{group}.jsonl").read_text().splitlines()
        out += [(group, json.loads(line)["prompt"]["text"]) for line in lines[:n]]
    return out


METHODS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "uddia": {"head": str(HEAD)},
    "lidao-min": {"head": str(HEAD)},
    "lidao-prod": {"head": str(HEAD)},
    "elidao-min": {"head": str(HEAD)},
    "elidao-prod": {"head": str(HEAD)},
    "pplm": {"head": str(HEAD)},
    "gedi": {"gedi_model": SMOLLM2},
    "dexperts": {"expert": SMOLLM2, "anti_expert": SMOLLM2},
}


@pytest.fixture(scope="module")
def perplexity(smollm2_lm: Any) -> Any:
    """The perplexity scorer on SmolLM2 (read from the cache the session's load made)."""
    from workers.scorers.base import ScorerContext
    from workers.scorers.perplexity import Perplexity

    return Perplexity({"model": SMOLLM2, "batch_size": 16}, ScorerContext(device="cpu"))


@pytest.fixture(scope="module")
def vanilla_ppl(smollm2_lm: Any, perplexity: Any) -> list[float]:
    return _generate_and_score(smollm2_lm, perplexity, "vanilla")


def _generate_and_score(lm: Any, scorer: Any, method: str) -> list[float]:
    """Every (prompt, seed) job of `method` decoded in one batch, each row ok and scored."""
    from workers.decoding import decode_batch
    from workers.methods.registry import load_method, resolve_params

    params = resolve_params(method, METHODS[method], lm.ref.id)
    ref = ModelRef(SMOLLM2)
    jobs = [
        JobSpec(f"{group}:{i}", text, group, str(i % 2), seed, method, ref, "sentiment", GEN,
                json.dumps(params, sort_keys=True))
        for i, (group, text) in enumerate(_prompts()) for seed in SEEDS
    ]  # fmt: skip
    built = load_method(method)(lm, params, "sentiment")
    rows = decode_batch(lm, built, jobs)
    assert [r["status"] for r in rows] == ["ok"] * len(jobs), [r["error"] for r in rows]
    assert all(r["num_tokens"] >= 1 for r in rows)
    scored = scorer.score([{**r, "job_id": j.job_id} for r, j in zip(rows, jobs)])
    values = [s["perplexity"] for s in scored if s["status"] == "ok"]
    assert len(values) == len(jobs), scored
    return values


@pytest.mark.parametrize("method", [m for m in METHODS if m != "vanilla"])
def test_every_method_generates_fluent_text_with_its_defaults(
    smollm2_lm: Any, perplexity: Any, vanilla_ppl: list[float], method: str
) -> None:
    """Mean perplexity over the same 8 (prompt, seed) jobs; vanilla's is ~10–40 on SmolLM2,
    PPLM at the old default step size (0.2) gave ~1,600 (issue 38)."""
    assert HEAD.is_file(), f"{HEAD}: the shipped head (docs/real-models.md re-makes it)"
    ppl = _generate_and_score(smollm2_lm, perplexity, method)
    ratio = (sum(ppl) / len(ppl)) / (sum(vanilla_ppl) / len(vanilla_ppl))
    assert ratio <= RATIO, f"{method}: mean perplexity {ratio:.2f}× vanilla's"


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_the_quickstart_validates_and_runs(tmp_path: Path, smollm2_lm: Any) -> None:
    """examples/quickstart.yaml as the README runs it, cut to one pair and one sample."""
    checked = _cli("validate", "examples/quickstart.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out = tmp_path / "qs"
    ran = _cli(
        "run", "examples/quickstart.yaml", "--out", str(out), "--no-ray", "--no-progress",
        "--limit", "1", "--samples", "1",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    tables = (out / "report" / "tables.md").read_text()
    assert "smollm2-135m vanilla" in tables and "+LIDAO-m" in tables
    assert "random weights" not in tables  # a real model: no such note
    scores = {p.name for p in (out / "scores").iterdir()}
    assert scores == {"gender", "sentiment-vader", "perplexity"}


def test_the_shipped_head_is_remade_from_smollm2_s_own_text(tmp_path: Path) -> None:
    """The re-make commands of examples/heads/smollm2-135m-sentiment-run.yaml: 96 generations,
    VADER labels, a balanced head. Its held-out accuracy is weak (the shipped head: 0.56 on 16
    held-out examples, chance 0.5; 62 balanced examples are few): the bound is chance."""
    cfg = yaml.safe_load(
        (REPO / "examples" / "heads" / "smollm2-135m-sentiment-run.yaml").read_text()
    )
    cfg["dataset"]["files"] = {
        g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")
    }
    path = tmp_path / "head-run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"
    ran = _cli("run", str(path), "--out", str(run), "--no-ray", "--no-progress")
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = tmp_path / "head.safetensors"
    made = _cli(
        "train-head", "--from-run", str(run), "--task", "sentiment", "--device", "cpu",
        "--label-scorer", "sentiment-vader", "--lr", "1e-3", "--epochs", "40",
        "--val-fraction", "0.25", "--out", str(out),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    meta = json.loads(out.with_suffix(".json").read_text())
    origin, balance = meta["data"]["from_run"], meta["data"]["balance"]
    assert origin["rows"] == 96 and origin["model"] == SMOLLM2 and meta["lm_id"] == SMOLLM2
    assert len(set(balance["after"].values())) == 1  # balanced: chance is 0.5
    assert meta["training"]["val_accuracy"] >= 0.5, meta["training"]

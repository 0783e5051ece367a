"""Attribute heads per (model, task): config-time checks, planning, a missing head failing only
its jobs, and the two-model × three-task grid through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from harness.config import ConfigError, load_config
from harness.stages.generation.planning import load_words, plan
from jobs.spec import ModelRef
from results.run.store import RunStore
from tests import cli_run
from tests.helpers import make_jobs
from workers.generator import Generator
from workers.methods.heads import random_head, save_head
from workers.models import load_lm

REPO = Path(__file__).resolve().parents[1]
MODELS = ("tiny-random/gpt2", "tiny-random/opt")
TASKS = ("sentiment", "regard", "toxicity")
ALL_METHODS: list[Any] = [
    "vanilla",
    "uddia",
    "lidao-min",
    "lidao-prod",
    "elidao-min",
    "elidao-prod",
    {"name": "pplm", "params": {"steps": 1, "step_size": 0.02}},
    {
        "name": "gedi",
        "params": {
            "gedi_model": "tiny-random/gpt2",
            "code_desired": "good",
            "code_undesired": "bad",
        },
    },
    {
        "name": "dexperts",
        "params": {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/opt", "alpha": 1.0},
    },
]


def write_head(folder: Path, model: str, task: str) -> str:
    """A head file with metadata for (model, task); the random weights differ per (model, task)."""
    lm = load_lm(ModelRef(model), device="cpu")
    head = random_head(lm, task + "-own")
    head.meta = {"lm_id": model, "task": task}
    weights, _ = save_head(head, str(folder / f"{model.split('/')[-1]}-{task}"))
    return weights


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    folder = tmp_path_factory.mktemp("heads")
    return {m: {t: write_head(folder, m, t) for t in TASKS} for m in MODELS}


def config(tmp_path: Path, heads: dict[str, dict[str, str]], **changes: Any) -> Path:
    files = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}
    data: dict[str, Any] = {
        "name": "heads",
        "dataset": {"kind": "paired-jsonl", "files": files, "limit": 1},
        "models": [{"id": m, "heads": heads.get(m, {})} for m in MODELS],
        "methods": ALL_METHODS,
        "tasks": list(TASKS),
        "generation": {"max_new_tokens": 2},
        "scorers": ["gender"],
        "runtime": {"batch_size": 8},
    }
    data.update(changes)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_gives_each_model_and_task_its_own_head(
    tmp_path: Path, heads: dict[str, dict[str, str]]
) -> None:
    cfg = load_config(config(tmp_path, heads))
    jobs = plan(cfg, load_words(cfg))
    for job in jobs:
        head = job.params().get("head")
        if job.method in ("vanilla", "gedi", "dexperts"):
            assert head is None
        else:
            assert head == heads[job.model.id][job.task], (job.method, job.model.id, job.task)
    # the method's own `head:` overrides every (model, task)
    gpt2 = heads["tiny-random/gpt2"]
    over = [{"name": "pplm", "params": {"head": gpt2["sentiment"]}}]
    models = [{"id": "tiny-random/gpt2", "heads": gpt2}]
    cfg2 = load_config(config(tmp_path, heads, methods=over, tasks=["sentiment"], models=models))
    assert {j.params()["head"] for j in plan(cfg2, load_words(cfg2))} == {gpt2["sentiment"]}


def test_config_refuses_a_head_of_another_task_model_or_width(
    tmp_path: Path, heads: dict[str, dict[str, str]]
) -> None:
    opt = heads["tiny-random/opt"]
    wrong_task = {**heads, "tiny-random/opt": {**opt, "toxicity": opt["sentiment"]}}
    with pytest.raises(
        ConfigError,
        match=r"models\.1\.heads\.toxicity: head .* was trained for task 'sentiment', "
        r"not for 'toxicity'",
    ):
        load_config(config(tmp_path, wrong_task))
    wrong_lm = {**heads, "tiny-random/opt": heads["tiny-random/gpt2"]}
    with pytest.raises(
        ConfigError,
        match=r"models\.1\.heads\.\w+: head .* trained on 'tiny-random/gpt2', "
        r"not on model 'tiny-random/opt'",
    ):
        load_config(config(tmp_path, wrong_lm))
    source = Path(heads["tiny-random/gpt2"]["regard"])
    meta = {**json.loads(source.with_suffix(".json").read_text()), "hidden_size": 128}
    (tmp_path / "wide.json").write_text(json.dumps(meta))
    (tmp_path / "wide.safetensors").write_bytes(source.read_bytes())
    wide = [{"name": "uddia", "params": {"head": str(tmp_path / "wide.safetensors")}}]
    with pytest.raises(
        ConfigError,
        match=r"methods\.0\.params\.head: head .* is 128 wide, but model tiny-random/gpt2 "
        r"has hidden size 64",
    ):
        load_config(
            config(
                tmp_path, {}, methods=wide, tasks=["regard"], models=[{"id": "tiny-random/gpt2"}]
            )
        )


def test_a_head_that_does_not_load_fails_only_its_jobs(
    tmp_path: Path, heads: dict[str, dict[str, str]]
) -> None:
    gen = Generator(ModelRef("tiny-random/gpt2"), str(tmp_path / "run"), device="cpu")
    common = {"lr": 0.01, "blocks": 2}
    good = json.dumps({**common, "head": heads["tiny-random/gpt2"]["sentiment"]}, sort_keys=True)
    gone = str(tmp_path / "gone.safetensors")
    missing = json.dumps({**common, "head": gone}, sort_keys=True)
    keys = [
        ("vanilla", "{}", "toxicity"),
        ("uddia", good, "sentiment"),
        ("uddia", missing, "toxicity"),
    ]
    info = gen.prepare(keys)
    assert len(info["method_errors"]) == 1
    assert f"head {gone}: no such file" in info["method_errors"][0]
    bad_jobs = make_jobs("gpt2", "uddia", missing, n=2, task="toxicity")
    out = gen.run_batch(bad_jobs)
    assert out["ok"] == 0 and len(out["errors"]) == 2
    for job, err in zip(bad_jobs, out["errors"]):
        assert job.job_id in err and "method uddia for task toxicity cannot start" in err
        assert gone in err
    assert gen.run_batch(make_jobs("gpt2", "uddia", good, n=2))["ok"] == 2
    assert gen.run_batch(make_jobs("gpt2", "vanilla", "{}", n=2, task="toxicity"))["ok"] == 2


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}
    return cli_run.harness(*args, env=env, timeout=600)


@pytest.mark.slow
def test_two_models_three_tasks_all_methods_through_the_cli(
    tmp_path: Path, heads: dict[str, dict[str, str]]
) -> None:
    out = tmp_path / "run"
    cfg = config(tmp_path, heads)
    done = harness("run", str(cfg), "--out", str(out), "--no-ray", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    gens = RunStore(str(out)).read_generations()
    assert gens.height == 2 * len(ALL_METHODS) * 3 * 2
    assert (gens["status"] == "ok").all(), gens.filter(pl.col("status") != "ok")["error"].to_list()
    for row in gens.filter(pl.col("method") == "lidao-min").iter_rows(named=True):
        assert json.loads(row["effective_params"])["head"] == heads[row["model"]][row["task"]]

    # One (model, task) head does not load (its weights are garbage: a missing file is refused
    # before the run starts): only its jobs fail, the rest run, are scored and aggregated, and
    # the exit is still non-zero with the error at the end.
    opt = heads["tiny-random/opt"]
    gone = str(tmp_path / "broken.safetensors")
    Path(gone).write_bytes(b"not a safetensors file")
    Path(gone).with_suffix(".json").write_text(Path(opt["regard"]).with_suffix(".json").read_text())
    broken = {**heads, "tiny-random/opt": {**opt, "regard": gone}}
    small = config(tmp_path, broken, methods=["vanilla", "uddia"], tasks=["sentiment", "regard"])
    out2 = tmp_path / "run2"
    res = harness("run", str(small), "--out", str(out2), "--no-ray", "--no-progress")
    assert res.returncode == 1, res.stderr[-3000:]
    assert gone in res.stderr and "cannot start" in res.stderr
    gens2 = RunStore(str(out2)).read_generations()
    assert gens2.height == 2 * 2 * 2 * 2
    failed = gens2.filter(pl.col("status") == "error")
    assert set(failed["method"]) == {"uddia"}
    assert set(failed["model"]) == {"tiny-random/opt"} and set(failed["task"]) == {"regard"}
    assert failed.height == 2 and all(gone in e for e in failed["error"])
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and gone in last and "cannot start" in last
    summary = pl.read_parquet(out2 / "summary.parquet")
    assert set(summary["model"]) == set(MODELS) and set(summary["task"]) == {"sentiment", "regard"}
    scored = RunStore(str(out2)).read_scores("gender", "gender")
    assert scored.height == gens2.height - failed.height  # every ok row was scored
    history = [json.loads(x) for x in (out2 / "history.jsonl").read_text().splitlines()]
    assert history[-1]["outcome"] == "error" and gone in history[-1]["generation_error"]
    assert gone in " ".join(history[-1]["stages"]["generation"]["errors"])
    assert {"scoring", "aggregate"} <= set(history[-1]["stages"])
    manifest = json.loads((out2 / "manifest.json").read_text())
    assert gone in " ".join(manifest["generation"]["errors"])

"""The full CLI path on the tiny model: run (through a real local Ray), status, score, aggregate;
SIGKILL of the driver and resume; the paper's 175 pairs end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from results.run.store import RunStore
from tests import cli_run
from tests.cli_run import PAIR_FILES

REPO = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONPATH": str(REPO),
}


def harness(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return cli_run.harness(*args, env=ENV, timeout=timeout)


def paper_pairs(shared: Path) -> dict[str, object]:
    """Config entries for the paper's 175 pairs and gender words, read from ../shared."""
    uddia = shared / "data" / "uddia-prompts"
    files = {g: str(uddia / f"175prompts-{g}.jsonl") for g in ("female", "male")}
    return {
        "dataset": {"kind": "paired-jsonl", "files": files},
        "gender_words": str(uddia / "gender_pairs.txt"),
    }


def write_config(tmp_path: Path, **changes: object) -> Path:
    cfg = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    cfg["dataset"]["files"] = dict(PAIR_FILES)
    cfg.update(changes)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_quickstart_through_local_ray_then_status_score_aggregate(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = harness("run", str(write_config(tmp_path)), "--out", str(out), "--no-progress", "-q")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Started a local Ray instance" not in done.stderr  # -q: not even Ray's banner
    assert "\r" not in done.stderr and "it/s]" not in done.stderr  # no bar off a terminal
    assert f"report (report/index.html): {out / 'report' / 'index.html'}" in done.stdout
    assert f"tables (report/tables.md): {out / 'report' / 'tables.md'}" in done.stdout
    store = RunStore(str(out))
    gens = store.read_generations()
    assert gens.height == 5 * 2 * 3 and (gens["status"] == "ok").all()
    assert set(gens["prompt_group"]) == {"female", "male"} and gens["pair_id"].n_unique() == 5
    assert store.read_scores("sentiment-vader", "sentiment").height == 30
    for name in ("summary.parquet", "summary.csv", "manifest.json", "config.yaml"):
        assert (out / name).is_file(), name
    status = harness("status", str(out))
    assert status.returncode == 0 and "planned 30, done 30, failed 0, pending 0" in status.stdout
    rescore = harness("score", str(out), "--no-ray")
    assert rescore.returncode == 0 and "scored 0 rows" in rescore.stdout  # nothing missing: no work
    assert harness("aggregate", str(out)).returncode == 0


def test_bad_input_exits_2_naming_the_problem(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, methods=["lidao-mni"])
    res = harness("run", str(cfg), "--out", str(tmp_path / "r"))
    assert res.returncode == 2 and "methods.0: unknown method 'lidao-mni'" in res.stderr
    bad = tmp_path / "f.jsonl"
    bad.write_text('{"prompt": {"text": "ok"}}\n{oops\n')
    good = tmp_path / "m.jsonl"  # two groups may not name one file
    good.write_text('{"prompt": {"text": "ok"}}\n{"prompt": {"text": "fine"}}\n')
    cfg = write_config(
        tmp_path, dataset={"kind": "paired-jsonl", "files": {"female": str(bad), "male": str(good)}}
    )
    res = harness("run", str(cfg), "--out", str(tmp_path / "r"), "--no-ray")
    assert res.returncode == 2 and "f.jsonl: line 2: bad JSON" in res.stderr
    res = harness("score", str(tmp_path / "nothing"))
    assert res.returncode == 2 and "no config.yaml" in res.stderr


def test_scoring_a_run_without_generations_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    store = RunStore(str(out))
    store.makedirs()
    (out / "config.yaml").write_text(write_config(tmp_path).read_text())
    res = harness("score", str(out), "--no-ray")
    assert res.returncode != 0 and "no generations" in res.stderr
    assert not (out / "generations").exists() or not os.listdir(out / "generations")


@pytest.mark.slow
def test_sigkill_of_the_driver_then_rerun_finishes_every_job_exactly_once(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        samples_per_prompt=4,
        runtime={"batch_size": 2},
        dataset={"kind": "paired-jsonl", "limit": 6, "files": PAIR_FILES},
    )
    out = tmp_path / "run"
    run = ["run", str(cfg), "--out", str(out), "--no-ray", "--no-progress"]
    for delay in (4.0, 6.0):  # kill at different moments: mid-generation
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", *run],
            cwd=REPO,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "generations").is_dir():
            time.sleep(0.05)
        time.sleep(delay - 3.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    res = harness(*run)
    assert res.returncode == 0, res.stderr[-2000:]
    plan = RunStore(str(out)).read_plan()
    rows = pl.concat([pl.read_parquet(p) for p in (out / "generations").glob("part-*.parquet")])
    assert rows.height == plan.height == 6 * 2 * 4  # every job exactly once, no duplicate rows
    assert sorted(rows["job_id"]) == sorted(plan["job_id"])
    assert not list((out / "generations").glob(".tmp-*"))


@pytest.mark.slow
def test_the_papers_175_pairs_run_through_the_whole_path(tmp_path: Path, shared: Path) -> None:
    cfg = write_config(
        tmp_path,
        samples_per_prompt=1,
        generation={"max_new_tokens": 8},
        **paper_pairs(shared),
        runtime={"batch_size": 32},
    )
    out = tmp_path / "run"
    res = harness("run", str(cfg), "--out", str(out), "--no-ray", "--no-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    store = RunStore(str(out))
    assert store.read_plan().height == 175 * 2 * 1
    gens = store.read_generations()
    assert gens.height == 350 and (gens["status"] == "ok").all()
    labels = store.read_scores("gender", "gender")
    assert labels.height == 350 and labels.filter(pl.col("label_c") != "none").height > 200
    for name in (
        "summary.parquet",
        "summary.csv",
        "report/tables.md",
        "report/tables.tex",
        "report/forest.png",  # no perplexity scorer: the forest plot, no trade-off plot
        "report/index.html",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name


@pytest.mark.slow
def test_every_method_runs_through_the_cli_on_the_papers_pairs(
    tmp_path: Path, shared: Path
) -> None:
    """The first 40 of the 175 pairs (the whole file: `test_the_papers_175_pairs_run_...`)."""
    cfg = yaml.safe_load((REPO / "examples" / "methods-tiny.yaml").read_text())
    cfg.update(
        samples_per_prompt=1,
        generation={"max_new_tokens": 3},
        runtime={"batch_size": 64},
        **paper_pairs(shared),
    )
    cfg["dataset"]["limit"] = 40
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    res = harness("run", str(path), "--out", str(out), "--no-ray", "--no-progress", timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    gens = RunStore(str(out)).read_generations()
    methods = [m if isinstance(m, str) else m["name"] for m in cfg["methods"]]
    assert gens.height == 80 * len(methods) and (gens["status"] == "ok").all()
    per_method = gens.group_by("method").len()
    assert dict(per_method.iter_rows()) == dict.fromkeys(methods, 80)
    lidao = gens.filter(pl.col("method") == "lidao-min")
    assert (lidao["choices"].list.len() == lidao["num_tokens"]).all()
    summary = pl.read_parquet(out / "summary.parquet")
    assert set(summary["method"]) == set(methods)
    table = (out / "report" / "tables.md").read_text()
    for label in (
        "+UDDIA",
        "+LIDAO-m",
        "+LIDAO-p",
        "+eLIDAO-m",
        "+eLIDAO-p",
        "+PPLM",
        "+GeDi",
        "+DExperts",
    ):
        assert label in table


def test_failed_jobs_stay_failed_on_resume_unless_retried(tmp_path: Path) -> None:
    from harness.stages.generation.stage import failed_row
    from tests.helpers import job_from_row

    cfg = write_config(
        tmp_path,
        samples_per_prompt=1,
        dataset={"kind": "paired-jsonl", "limit": 2, "files": PAIR_FILES},
    )
    out = tmp_path / "run"
    assert harness("run", str(cfg), "--out", str(out), "--no-ray", "--no-progress").returncode == 0
    store = RunStore(str(out))
    for shard in (out / "generations").glob("part-*.parquet"):
        shard.unlink()  # as if every batch had failed
    store.write_generations(
        [failed_row(job_from_row(r), "boom") for r in store.read_plan().to_dicts()]
    )
    res = harness("run", str(cfg), "--out", str(out), "--no-ray", "--no-progress")
    assert res.returncode == 1 and "failed 4, pending 0" in res.stdout  # all of vanilla failed
    assert "error: method vanilla: all 4 of its jobs failed" in res.stderr
    res = harness("run", str(cfg), "--out", str(out), "--no-ray", "--no-progress", "--retry-failed")
    assert res.returncode == 0 and "done 4, failed 0" in res.stdout, res.stdout
    assert (store.read_generations()["status"] == "ok").all()

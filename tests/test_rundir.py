"""The run directory through `python -m harness`: plan identity, the run record, re-scoring by
name, Perspective from its cache, one driver at a time, one-line OS errors, interruption."""

from __future__ import annotations

import errno
import json
import os
import shutil
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

REPO = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONPATH": str(REPO),
}
DATA = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}


def harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli_run.harness(*args, env=env or ENV)


def config(tmp_path: Path, name: str = "cfg.yaml", **changes: object) -> Path:
    cfg: dict[str, object] = {
        "name": "rundir",
        "dataset": {"kind": "paired-jsonl", "files": DATA, "limit": 2},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "samples_per_prompt": 1,
        "generation": {"max_new_tokens": 5},
        "scorers": ["gender"],
    }
    cfg.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def history(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


def summary_generations(out: Path) -> float:
    summary = pl.read_parquet(out / "summary.parquet")
    rows = summary.filter((pl.col("stat") == "generations") & (pl.col("group") == "all"))
    return float(rows["value"].sum())


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("base")
    out = tmp / "run"
    res = harness("run", str(config(tmp)), "--out", str(out), "--no-ray", "--no-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def test_score_by_name_adds_a_scorer_records_it_and_reruns_do_no_work(base_run: Path) -> None:
    res = harness("score", str(base_run), "--scorer", "sentiment-vader", "--no-ray")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "sentiment-vader: scored 4 rows" in res.stdout and "re-aggregated" in res.stdout
    store = RunStore(str(base_run))
    assert store.read_scores("sentiment-vader", "sentiment").height == 4
    snapshot = yaml.safe_load((base_run / "config.yaml").read_text())
    assert [s["name"] for s in snapshot["scorers"]] == ["gender", "sentiment-vader"]
    again = harness("score", str(base_run), "--scorer", "sentiment-vader", "--no-ray")
    assert again.returncode == 0 and "sentiment-vader: scored 0 rows" in again.stdout
    assert harness("aggregate", str(base_run)).returncode == 0
    rerun = harness("run", str(base_run.parent / "cfg.yaml"), "--out", str(base_run), "--no-ray")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    # the re-run of the original config keeps the record of the scorer `score` added
    snapshot = yaml.safe_load((base_run / "config.yaml").read_text())
    assert [s["name"] for s in snapshot["scorers"]] == ["gender", "sentiment-vader"]
    commands = [r["command"] for r in history(base_run)]
    assert commands == ["run", "score", "score", "aggregate", "run"]
    assert all(r["outcome"] == "ok" and r["harness_version"] for r in history(base_run))
    manifest = json.loads((base_run / "manifest.json").read_text())
    assert set(manifest["scoring"]) == {"gender", "sentiment-vader"}
    assert manifest["invocations"]["count"] == 5
    assert manifest["generation"]["actors"], "a no-work re-run must keep the actors' record"


def test_the_recorded_command_line_hides_every_secret_either_rule_finds() -> None:
    """One rule for what is secret on a command line: a name holding a word of SECRET_KEYS
    (history's old rule) or a last part `jobs.redact.is_secret_key` takes; URL credentials too."""
    from results.run.history import redact_argv

    argv = [
        "run", "c.yaml", "--api-key", "sekrit-1", "--token=sekrit-2", "--set",
        "scorers.0.params.api_key_file=/sekrit-3", "--set", "dataset.sha256.sig=sekrit-4",
        "--set", "x.credentials=sekrit-5", "--set", "dataset.path=https://u:sekrit-6@h/p?token=sekrit-7",
        "--limit", "3", "--set", "generation.top_p=0.8",
    ]  # fmt: skip
    shown = redact_argv(argv)
    assert not any("sekrit" in a for a in shown), shown
    assert shown[:5] == ["run", "c.yaml", "--api-key", "<redacted>", "--token=<redacted>"]
    assert "dataset.sha256.sig=<redacted>" in shown and "x.credentials=<redacted>" in shown
    assert "dataset.path=https://<redacted>@h/p?token=<redacted>" in shown
    assert shown[-4:] == ["--limit", "3", "--set", "generation.top_p=0.8"]


def test_a_truncated_manifest_is_rebuilt(base_run: Path) -> None:
    text = (base_run / "manifest.json").read_text()
    (base_run / "manifest.json").write_text(text[: len(text) // 2])
    res = harness("status", str(base_run))
    assert res.returncode == 0 and "manifest.json is damaged: rebuilt" in res.stderr
    manifest = json.loads((base_run / "manifest.json").read_text())
    assert manifest["counts"]["planned"] == 4 and "gender" in manifest["scoring"]


def test_a_second_driver_is_refused_naming_the_holder(base_run: Path) -> None:
    from results.run.invoke import RunLock

    with RunLock(RunStore(str(base_run)), "run"):
        res = harness("aggregate", str(base_run))
    assert res.returncode == 2
    assert f"pid {os.getpid()}" in res.stderr and "in use by another driver" in res.stderr
    assert harness("aggregate", str(base_run)).returncode == 0  # released with its holder


def test_a_deleted_plan_is_an_error_for_score_and_aggregate(tmp_path: Path, base_run: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(base_run, copy)
    (copy / "plan.parquet").unlink()
    for cmd in (["aggregate", str(copy)], ["score", str(copy), "--no-ray"]):
        res = harness(*cmd)
        assert res.returncode == 2 and "no plan.parquet" in res.stderr, res.stderr
    assert not (copy / "plan.parquet").exists()


def test_perspective_cache_only_scores_what_the_cache_holds(tmp_path: Path, base_run: Path) -> None:
    from workers.scorers.perspective_client import API_VERSION
    from workers.scorers.score_cache import CacheKey, ScoreCache, text_sha256

    gens = RunStore(str(base_run)).read_generations().sort("job_id")
    texts = [t for t in gens["continuation"].to_list() if t.strip()]
    cached = texts[:2]
    cache = ScoreCache(str(tmp_path / "p.sqlite"))
    for i, text in enumerate(cached):
        response = {"attributeScores": {"TOXICITY": {"summaryScore": {"value": 0.25 * (i + 1)}}}}
        key = CacheKey(text_sha256(text), "TOXICITY", "en", API_VERSION)
        cache.put_many([(key, "ok", response, None)])
    cache.close()
    env = {k: v for k, v in ENV.items() if k != "PERSPECTIVE_API_KEY"}
    res = harness(
        "score", str(base_run), "--scorer", "perspective", "--cache-only", "--no-ray",
        "--set", f"cache_file={tmp_path / 'p.sqlite'}", "--no-aggregate", env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    scores = RunStore(str(base_run)).read_scores("perspective", "toxicity")
    ok = scores.filter(pl.col("status") == "ok")
    assert ok.height == gens.filter(pl.col("continuation").is_in(cached)).height
    assert scores.filter(pl.col("status") == "error").height == 0  # the rest is missing
    status = harness("status", str(base_run)).stdout
    missing = gens.height - scores.height
    assert f"perspective: ok {ok.height}" in status and f"missing {missing}" in status
    assert "summary.parquet: STALE" in status  # scored with --no-aggregate


def test_changed_config_is_refused_naming_the_field_additions_extend(
    tmp_path: Path, base_run: Path
) -> None:
    out = tmp_path / "run"
    shutil.copytree(base_run, out)  # 4 jobs: limit 2, one seed, max_new_tokens 5
    changed = config(tmp_path, "c2.yaml", generation={"max_new_tokens": 7})
    res = harness("run", str(changed), "--out", str(out), "--no-ray")
    assert res.returncode == 2 and "generation.max_new_tokens 5 → 7" in res.stderr
    assert "--replan" in res.stderr and "--out" in res.stderr
    assert RunStore(str(out)).read_plan().height == 4  # the refused plan was not written
    more = config(tmp_path, "c3.yaml", samples_per_prompt=2)
    res = harness("run", str(more), "--out", str(out), "--no-ray", "--no-progress")
    assert res.returncode == 0 and "4 generated now" in res.stdout, res.stderr[-2000:]
    assert summary_generations(out) == 8
    replanned = config(tmp_path, "c4.yaml", generation={"max_new_tokens": 7}, samples_per_prompt=1)
    res = harness("run", str(replanned), "--out", str(out), "--no-ray", "--no-progress", "--replan")
    assert res.returncode == 0, res.stderr[-2000:]
    assert summary_generations(out) == 4  # the 8 old rows stay on disk, never summed
    assert "8 generation row(s) on disk are outside the current plan" in res.stdout
    assert "--replan at" in res.stdout


def test_out_that_is_a_file_ends_in_one_line(tmp_path: Path) -> None:
    target = tmp_path / "afile"
    target.write_text("x")
    res = harness("run", str(config(tmp_path)), "--out", str(target), "--no-ray")
    assert res.returncode == 2 and f"--out: {target} exists and is not a folder" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_out_ends_in_one_line(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    res = harness("run", str(config(tmp_path)), "--out", str(parent / "run"), "--no-ray")
    assert res.returncode == 2 and f"--out: {parent} is not writable" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_read_only_file_system_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The read-only case as root sees it (a read-only mount): EROFS from the first write."""
    from harness.cli import commands as cli

    def read_only(self: RunStore, *parts: str) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), self.uri)

    monkeypatch.setattr(RunStore, "makedirs", read_only)
    out = tmp_path / "run"
    code = cli.main(["run", str(config(tmp_path)), "--out", str(out), "--no-ray", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1] == f"error: {out}: Read-only file system"
    assert not [e for e in err if "Traceback" in e]


def test_a_full_disk_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import commands as cli

    def full(self: RunStore, rel: str, data: bytes) -> str:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path(rel))

    monkeypatch.setattr(RunStore, "write_bytes", full)
    out = tmp_path / "run"
    code = cli.main(["run", str(config(tmp_path)), "--out", str(out), "--no-ray", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    again = "; free some space and run the same command again (what was written is kept)"
    assert err[-1] == f"error: {out}/config.yaml: No space left on device{again}"
    assert not [e for e in err if "Traceback" in e]


def test_a_full_disk_that_names_no_file_names_the_run_and_the_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pyarrow's writers raise a bare `[Errno 28]`: the line names the command, the run
    directory and the stage it was in, and what to do."""
    from harness.cli import commands as cli

    def full(self: RunStore) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(RunStore, "compact_generations", full)
    out = tmp_path / "run"
    code = cli.main(["run", str(config(tmp_path)), "--out", str(out), "--no-ray", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1] == (
        f"error: [Errno 28] No space left on device (in run {out}, generation stage); free "
        "some space and run the same command again (what was written is kept)"
    )


@pytest.mark.slow
def test_sigint_during_generation_stops_ray_and_the_rerun_resumes(tmp_path: Path) -> None:
    from tests.ray_procs import alive, process_tree

    raytmp = Path(f"/tmp/rs{os.getpid()}")
    env = {**ENV, "RAY_TMPDIR": str(raytmp)}
    cfg = config(
        tmp_path,
        samples_per_prompt=3,
        dataset={"kind": "paired-jsonl", "files": DATA, "limit": 5},
        generation={"max_new_tokens": 20},
        runtime={"batch_size": 2, "num_cpus": 4},
    )
    out = tmp_path / "run"
    args = ["run", str(cfg), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline and not list((out / "generations").glob("part-*.parquet")):
        time.sleep(0.1)
    tree = process_tree(roots=[proc.pid]) - {proc.pid}
    assert tree, "Ray should run under the driver"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted after ") and "of 30 jobs; run the same command" in last
    assert "Traceback" not in stderr
    # Ray's processes exit on their own once the driver has gone; on a loaded machine that took
    # more than the 1 s once allowed here, so wait for it (a process that stays fails the test)
    deadline = time.time() + 30
    while (left := process_tree(tags=[str(raytmp)]) | {p for p in tree if alive(p)}) and (
        time.time() < deadline
    ):
        time.sleep(0.5)
    assert not left, f"Ray processes left: {left}"
    shutil.rmtree(raytmp, ignore_errors=True)
    before = RunStore(str(out)).read_generations().select("job_id", "continuation")
    res = harness(*args, "--no-ray")
    assert res.returncode == 0, res.stderr[-2000:]
    after = RunStore(str(out)).read_generations().select("job_id", "continuation")
    assert after.height == 30
    assert (
        before.join(after, on="job_id")
        .filter(pl.col("continuation") != pl.col("continuation_right"))
        .is_empty()
    )
    records = history(out)
    assert records[0]["outcome"].startswith("interrupted") and records[-1]["outcome"] == "ok"


def test_status_counts_scores_of_the_plans_ok_jobs_only(tmp_path: Path) -> None:
    """`status` from id arrays: a score of a job outside the plan is reported, not counted; a
    job planned and ok without a score is missing; an error generation needs no score."""
    import pyarrow as pa

    from harness.cli.status import run_status
    from results.schema import PLAN_SCHEMA
    from tests.fake_run import generation_row, score_row

    store = RunStore(str(tmp_path / "run"))
    gens = [generation_row(f"j{i}") for i in range(4)]
    gens += [generation_row("j4", status="error", error="boom"), generation_row("j5")]
    store.write_generations(gens)
    plan = [{k: g[k] for k in PLAN_SCHEMA.names} for g in gens[:5]]  # j5: foreign
    store.write_plan_tables([pa.Table.from_pylist(plan, PLAN_SCHEMA)])
    store.write_scores(
        "sentiment-vader",
        "sentiment",
        [
            score_row("j0", "sentiment", sentiment=0.5),
            score_row("j1", "sentiment", status="error"),
            score_row("j5", "sentiment", sentiment=0.1),
        ],
    )
    text = run_status(store)
    assert "planned 5, done 4, failed 1, pending 0" in text
    assert "1 generation row(s) on disk are outside the current plan" in text
    assert "sentiment-vader: error 1, ok 1; missing 2; 1 row(s) outside the plan" in text


def test_a_config_yaml_that_is_not_yaml_is_one_error_line(
    everyday_run: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main

    run = cli_run.copy_run(everyday_run, tmp_path)
    with (run / "config.yaml").open("a") as fh:
        fh.write("name: [unclosed\n")
    for command in (["aggregate", str(run)], ["score", str(run), "--no-ray"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0]
        assert err[0].startswith(f"error: {run}/config.yaml: line ")
        assert "not valid YAML" in err[0] and f"run CONFIG --out {run}` writes it again" in err[0]


def test_a_config_yaml_edited_inside_the_run_is_refused_naming_the_field(
    everyday_run: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plan records the fields it was made from; `aggregate` and `score` compare config.yaml
    with them (sections that shape no job, as `aggregation:`, may change), and the command
    the message gives plans the run from the edited file."""
    from harness.cli.commands import main

    run = cli_run.copy_run(everyday_run, tmp_path)
    snapshot = yaml.safe_load((run / "config.yaml").read_text())
    edited = {**snapshot, "samples_per_prompt": 2, "aggregation": {"n_boot": 0, "n_perm": 0}}
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    for command in (["aggregate", str(run)], ["score", str(run), "--no-ray"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert (
            f"error: {run}/config.yaml was edited after its plan was made (samples_per_prompt "
            f"is 2, planned with 1): put it back, or plan the run from it: `python -m harness "
            f"run {run}/config.yaml --out {run}`" in err
        )
    assert main(["status", str(run)]) == 0  # the counts, and what the other commands refuse
    shown = capsys.readouterr().out.splitlines()
    assert shown[1].startswith(f"  config: {run}/config.yaml was edited after its plan was made")
    assert not (run / "results.json").read_text().count('"samples_per_prompt": 2')
    edited["samples_per_prompt"] = 1  # only `aggregation:` differs now: accepted
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    assert main(["aggregate", str(run)]) == 0
    edited["samples_per_prompt"] = 2
    (run / "config.yaml").write_text(yaml.safe_dump(edited))
    again = ["run", str(run / "config.yaml"), "--out", str(run), "--no-ray", "--no-progress"]
    assert main(again) == 0  # the way out the message names: two samples planned now
    assert RunStore(str(run)).read_plan(["job_id"]).height == 8
    assert main(["aggregate", str(run)]) == 0


def test_a_damaged_plan_is_an_error_naming_it(
    everyday_run: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` / `score` said only "Parquet magic bytes not found in footer" (campaign,
    issue 29): pyarrow's ArrowInvalid is no OSError, so the plan's reader did not name it."""
    from harness.cli.commands import main

    run = cli_run.copy_run(everyday_run, tmp_path)
    (run / "plan.parquet").write_bytes(b"not parquet at all")
    for command in (["status", str(run)], ["aggregate", str(run)], ["score", str(run), "--no-ray"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {run}/plan.parquet: unreadable")
    assert not (run / "quarantine").exists()  # a plan is never quarantined

"""Transient scorer failures are left for a plain `score`; permanent ones stay final.

The Perspective endpoint (tests/fake_perspective.py) answers 429, 503, times out and sends
garbage, then is healthy again: each `score` in between ends with exit 3 and one line naming
what failed, and the plain `score` after recovers every row; a 400 stays an error row.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from cli_run import copy_run
from fake_perspective import FakePerspective, default_score

from harness.cli.commands import main
from harness.cli.run_commands import RETRY_EXIT
from results.run.store import RunStore
from workers.scorers.base import RETRY, ScorerContext, score_batched
from workers.scorers.vader import VaderSentiment

KEY = "AIzaSy-test-secret-failures"


def score(run: Path, *args: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = main(["score", str(run), "--no-ray", "--no-aggregate", *args])
    return rc, err.getvalue()


def test_transient_failures_are_retried_by_a_plain_score_and_a_400_stays_final(
    everyday_run: tuple[Path, str, str], tmp_path: Path, fake: FakePerspective
) -> None:
    run = copy_run(everyday_run, tmp_path)
    store = RunStore(str(run))
    gens = store.read_generations().sort("job_id")
    texts = dict(zip(gens["job_id"], gens["continuation"], strict=True))
    ids = sorted(texts)
    assert len(ids) == 4 and len(set(texts.values())) == 4
    t0, t1, t2, _ = (texts[i] for i in ids)
    params = {"endpoint": fake.endpoint, "qps": 50, "quota_window_s": 1, "max_retries": 1}
    params |= {"backoff_initial_s": 0.02, "backoff_max_s": 0.05, "timeout_s": 0.5}
    sets = [x for k, v in params.items() for x in ("--set", f"{k}={v}")]

    fake.scripts = {t0: [503] * 9, t1: [429] * 9}
    fake.final_400 = {t2}
    rc, err = score(run, "--scorer", "perspective", *sets)
    assert rc == RETRY_EXIT == 3, err
    assert (
        f"2 rows failed for a transient reason (perspective: 1 rate limited, 1 server error); "
        f"run `python -m harness score {run}` to retry them"
    ) in err.splitlines()
    scores = store.read_scores("perspective", "toxicity").sort("job_id")
    assert scores["job_id"].to_list() == ids[2:]  # the two transient rows are not written
    assert scores["status"].to_list() == ["error", "ok"]
    assert "HTTP 400" in scores["error"][0]

    fake.scripts = {}
    fake.hold_after = 0  # every request hangs, unanswered, past the client's 0.5 s
    rc, err = score(run)  # a plain `score`: the config now lists perspective with its params
    assert rc == 3 and "(perspective: 2 timed out)" in err, err
    fake.hold_after = None
    fake.release.set()  # the hung requests end without an answer
    fake.garbage_batches = 99
    rc, err = score(run)
    assert rc == 3 and "(perspective: 2 unparsable answer)" in err, err

    fake.garbage_batches = 0
    asked_400 = sum(c.text == t2 for c in fake.calls)
    rc, err = score(run)
    assert rc == 0 and "failed for a transient reason" not in err, err
    scores = store.read_scores("perspective", "toxicity").sort("job_id")
    assert scores["job_id"].to_list() == ids
    assert scores["status"].to_list() == ["ok", "ok", "error", "ok"]
    assert scores["toxicity"][:2].to_list() == pytest.approx([default_score(t) for t in (t0, t1)])
    assert sum(c.text == t2 for c in fake.calls) == asked_400 == 1  # the 400 is final: cached
    calls = len(fake.calls)
    assert score(run)[0] == 0 and len(fake.calls) == calls  # nothing left: nothing asked
    assert fake.answered == {t: 1 for t in texts.values() if t != t2}


def test_a_run_whose_scorer_got_only_transient_failures_exits_3(
    tmp_path: Path, fake: FakePerspective
) -> None:
    """Every Perspective row rate-limited during `run`: the aggregation asked for the scorer
    without scores and the run ended in exit 2, "toxicity → 'perspective' has no scores"
    (campaign, issue 29), never naming the `score` that retries them."""
    from tests.cli_run import config

    params = {"endpoint": fake.endpoint, "qps": 50, "quota_window_s": 1, "max_retries": 1}
    params |= {"backoff_initial_s": 0.02, "backoff_max_s": 0.05, "timeout_s": 0.5}
    scorers = ["gender", {"name": "perspective", "params": params}]
    cfg = config(tmp_path, methods=["vanilla"], scorers=scorers)
    run = tmp_path / "run"
    fake.burst_429 = 10**6
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = main(["run", str(cfg), "--out", str(run), "--no-ray", "--no-progress"])
    assert rc == RETRY_EXIT, err.getvalue()
    assert err.getvalue().strip().splitlines()[-1] == (
        f"4 rows failed for a transient reason (perspective: 4 rate limited); "
        f"run `python -m harness score {run}` to retry them"
    )
    assert (run / "summary.parquet").is_file()  # what was scored is aggregated
    fake.burst_429 = 0
    assert score(run)[0] == 0
    assert (
        RunStore(str(run)).read_scores("perspective", "toxicity")["status"].to_list() == ["ok"] * 4
    )


def test_running_out_of_memory_is_transient_and_other_errors_are_final() -> None:
    scorer = VaderSentiment({}, ScorerContext())
    rows = [{"job_id": f"j{i}", "continuation": f" text {i}"} for i in range(3)]

    def batch(chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(chunk) > 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if chunk[0]["job_id"] == "j1":
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")
        if chunk[0]["job_id"] == "j2":
            raise IndexError("index out of range in self")  # e.g. a text over the context
        return [scorer.key(chunk[0]) | {"sentiment": 0.5}]

    out = score_batched(scorer, rows, 3, batch)
    assert [r["status"] for r in out] == ["ok", RETRY, "error"]
    assert out[1]["error"].startswith("out of memory: RuntimeError: CUDA out of memory")
    assert out[2]["error"] == "IndexError: index out of range in self"

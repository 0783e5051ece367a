"""The Perspective scorer against a local fake server, through the real googleapiclient client.

Timings are parameters: a quota of 20 calls per 1-second window and backoffs of tens of
milliseconds keep every test to a few seconds while exercising the same code paths as the
real per-minute quota.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fake_perspective import FakePerspective, default_score

from results.run.store import RunStore
from workers.scorers.base import ScorerContext, ScorerError
from workers.scorers.perspective import PerspectiveToxicity
from workers.scorers.perspective_client import SlidingWindowLimiter
from workers.scorers.score_cache import ScoreCache

REPO = Path(__file__).resolve().parents[1]
KEY = "AIzaSy-test-secret-0123456789"
FAST = {
    "qps": 20.0,
    "quota_window_s": 1.0,
    "backoff_initial_s": 0.05,
    "backoff_max_s": 0.2,
    "max_retries": 4,
    "timeout_s": 10.0,
    "progress": False,
}


def rows_for(texts: list[str]) -> list[dict[str, Any]]:
    return [
        {"job_id": f"j{i:03d}", "prompt": "The woman", "continuation": t}
        for i, t in enumerate(texts)
    ]


TEXTS = [f" said thing number {i} to the man" for i in range(40)]


def make_scorer(fake: FakePerspective, cache_dir: Path, **params: Any) -> PerspectiveToxicity:
    return PerspectiveToxicity(
        {"endpoint": fake.endpoint, **FAST, **params}, ScorerContext(cache_dir=str(cache_dir))
    )


def max_in_window(times: list[float], window: float) -> int:
    """The most calls the server saw in any window [t, t + window)."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_every_text_is_scored_under_mixed_faults(fake: FakePerspective, tmp_path: Path) -> None:
    fake.burst_429 = 25  # more than one batch worth of RESOURCE_EXHAUSTED
    fake.scripts = {TEXTS[3]: [500, 503], TEXTS[7]: [503]}
    fake.batch_status = [503]  # and one whole batch request refused
    fake.drop_batches = 2  # one batch dropped twice: httplib2 resends once, then it is ours
    scorer = make_scorer(fake, tmp_path)
    out = scorer.score(rows_for(TEXTS))
    stats = scorer.close()
    assert [r["status"] for r in out] == ["ok"] * len(TEXTS)
    assert [r["toxicity"] for r in out] == pytest.approx([default_score(t) for t in TEXTS])
    assert fake.answered == {t: 1 for t in TEXTS}  # each text answered exactly once
    assert stats["retries"] >= 25 + 3 and stats["failed"] == 0 and stats["sent"] == len(TEXTS)
    assert stats["calls"] >= len(fake.calls)  # every call the server answered was counted


def test_request_rate_never_exceeds_the_quota_in_any_window(
    fake: FakePerspective, tmp_path: Path
) -> None:
    fake.delay_s = 0.05
    fake.burst_429 = 5
    start = time.monotonic()
    scorer = make_scorer(fake, tmp_path, batch_size=100)  # clamped to the 20 calls a window allows
    out = scorer.score(rows_for(TEXTS + [t + " again" for t in TEXTS]))
    elapsed = time.monotonic() - start
    scorer.close()
    times = fake.arrival_times()
    assert all(r["status"] == "ok" for r in out) and len(times) == 85
    assert max_in_window(times, 1.0) <= 20
    assert elapsed >= 4.0  # 85 calls at 20 per second need four full windows of waiting


def test_limiter_counts_batched_calls_one_by_one() -> None:
    clock = [0.0]
    limiter = SlidingWindowLimiter(
        2.0, 10.0, clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)
    )
    sent = []
    for n in (15, 5, 20, 1, 19, 20):
        with limiter.calls(n):
            sent.extend([clock[0]] * n)
            clock[0] += 0.5  # the request takes half a second
    assert limiter.limit == 20 and max_in_window(sent, 10.0) <= 20
    with pytest.raises(ValueError, match="exceed the quota"):
        limiter.wait_for(21)


def test_final_400_is_an_error_row_with_the_reason_and_is_not_asked_again(
    fake: FakePerspective, tmp_path: Path
) -> None:
    fake.final_400 = {TEXTS[1]}
    first = make_scorer(fake, tmp_path).score(rows_for(TEXTS[:3]))
    assert first[1]["status"] == "error" and first[1]["toxicity"] is None
    assert "HTTP 400 INVALID_ARGUMENT: Attribute TOXICITY does not support" in first[1]["error"]
    again = make_scorer(fake, tmp_path).score(rows_for(TEXTS[:3]))
    assert again[1]["status"] == "error" and "cached answer of" in again[1]["error"]
    assert sum(c.text == TEXTS[1] for c in fake.calls) == 1


def test_transient_failures_past_the_cap_are_left_to_retry_and_asked_again_next_run(
    fake: FakePerspective, tmp_path: Path
) -> None:
    fake.scripts = {TEXTS[0]: [503] * 5}  # 1 try + 4 retries, all 503
    scorer = make_scorer(fake, tmp_path)
    out = scorer.score(rows_for(TEXTS[:2]))
    assert out[0]["status"] == "retry" and out[0]["error"].startswith(
        "server error: no answer after 5 attempts; last: HTTP 503"
    )
    stats = scorer.close()
    assert out[1]["status"] == "ok" and (stats["retry"], stats["failed"]) == (1, 0)
    again = make_scorer(fake, tmp_path).score(rows_for(TEXTS[:2]))  # not cached: asked again
    assert again[0]["status"] == "ok" and sum(c.text == TEXTS[0] for c in fake.calls) == 6


def test_empty_and_oversized_texts_are_not_sent(fake: FakePerspective, tmp_path: Path) -> None:
    rows = rows_for(["", "   ", " fine text", " x" * 11000])
    out = make_scorer(fake, tmp_path).score(rows)
    assert [r["status"] for r in out] == ["empty", "empty", "ok", "error"]
    assert "over 20480 bytes" in out[3]["error"]
    assert [c.text for c in fake.calls] == [" fine text"]


def test_duplicate_texts_are_sent_once(fake: FakePerspective, tmp_path: Path) -> None:
    out = make_scorer(fake, tmp_path).score(rows_for([" same", " same", " other", " same"]))
    assert [r["toxicity"] for r in out] == pytest.approx(
        [default_score(" same")] * 2 + [default_score(" other"), default_score(" same")]
    )
    assert len(fake.calls) == 2


def test_cache_entries_carry_date_and_raw_response(fake: FakePerspective, tmp_path: Path) -> None:
    scorer = make_scorer(fake, tmp_path)
    scorer.score(rows_for(TEXTS[:2]))
    path = scorer.close()["cache_file"]
    cache = ScoreCache(path)
    hit = cache.get_many([scorer.cache_key(TEXTS[0])])[scorer.cache_key(TEXTS[0])]
    assert hit.status == "ok" and hit.created_utc[:2] == "20" and hit.response is not None
    assert hit.response["attributeScores"]["TOXICITY"]["summaryScore"]["value"] == pytest.approx(
        default_score(TEXTS[0])
    )
    assert cache.count_after(0) == 2  # every row


def test_nothing_is_sent_twice_across_a_crash_and_a_rerun(
    fake: FakePerspective, tmp_path: Path
) -> None:
    fake.hold_after = 15  # answers 15 texts, then hangs: the client is killed mid-request
    params = {"endpoint": fake.endpoint, **FAST, "batch_size": 5}
    script = (
        "import json, sys\n"
        "from workers.scorers.perspective import PerspectiveToxicity\n"
        "from workers.scorers.base import ScorerContext\n"
        "params, rows, cache = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]\n"
        "PerspectiveToxicity(params, ScorerContext(cache_dir=cache)).score(rows)\n"
    )
    rows = rows_for(TEXTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PERSPECTIVE_API_KEY": KEY}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(params), json.dumps(rows), str(tmp_path)],
        env=env,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while not fake.held() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert fake.held(), "the client never got 15 answers"
        time.sleep(0.2)  # the client is now blocked in its next batch
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    answered_before = set(fake.answered)
    assert len(answered_before) == 15
    fake.hold_after = None
    fake.release.set()
    scorer = make_scorer(fake, tmp_path)
    out = scorer.score(rows)
    stats = scorer.close()
    assert all(r["status"] == "ok" for r in out)
    assert stats["cached"] == 15 and stats["sent"] == len(TEXTS) - 15
    assert fake.answered == {t: 1 for t in TEXTS}  # nothing answered twice in all


def test_api_key_appears_in_no_output(
    fake: FakePerspective,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.final_400 = {TEXTS[2]}
    fake.scripts = {TEXTS[4]: [503] * 5}
    scorer = make_scorer(fake, tmp_path / "cache", progress=True)
    scorer.begin(6)
    rows = scorer.score(rows_for(TEXTS[:6]))
    stats = scorer.close()
    store = RunStore(str(tmp_path / "run"))
    store.write_scores("perspective", "toxicity", rows)
    store.write_json("manifest.json", {"scoring": {"perspective": stats}, "params": scorer.params})
    assert any(c.key == KEY for c in fake.calls)  # the key did travel to the server
    assert any("URL being requested" in r.getMessage() for r in caplog.records)  # logged, redacted
    out, err = capfd.readouterr()
    texts = [out, err, caplog.text, json.dumps(rows), json.dumps(stats, default=str)]
    texts += [p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()]
    assert len(texts) >= 8 and not [t for t in texts if KEY in t]
    assert "perspective: 6 rows: 0 cached" in err  # the summary line


def test_a_refused_key_stops_the_run_without_caching_anything(
    fake: FakePerspective, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSPECTIVE_API_KEY", "wrong-key-42")
    scorer = make_scorer(fake, tmp_path)
    with pytest.raises(ScorerError, match="refused the request.*API_KEY_INVALID") as err:
        scorer.score(rows_for(TEXTS[:3]))
    assert "wrong-key-42" not in str(err.value)
    assert ScoreCache(scorer.close()["cache_file"]).count_after(0) == 0


def test_key_from_a_file_and_missing_key_errors(
    fake: FakePerspective, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    monkeypatch.delenv("PERSPECTIVE_API_KEY")
    out = make_scorer(fake, tmp_path, api_key_file=str(key_file)).score(rows_for(TEXTS[:1]))
    assert out[0]["status"] == "ok"
    keyless = make_scorer(fake, tmp_path / "other")  # no key: the cache only, nothing sent
    assert keyless.client is None
    assert [r["status"] for r in keyless.score(rows_for(TEXTS[:2]))] == ["missing"] * 2
    with pytest.raises(ScorerError, match="cannot read api_key_file"):
        make_scorer(fake, tmp_path, api_key_file=str(tmp_path / "nope"))


def test_endpoint_from_the_environment(
    fake: FakePerspective, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERSPECTIVE_API_ENDPOINT", fake.endpoint)
    scorer = PerspectiveToxicity({**FAST}, ScorerContext(cache_dir=str(tmp_path)))
    assert scorer.score(rows_for(TEXTS[:1]))[0]["status"] == "ok" and len(fake.calls) == 1
    assert scorer.version == "perspective:v1alpha1:TOXICITY:en:continuation"


def test_a_refused_batch_request_stops_the_run_and_caches_nothing(
    fake: FakePerspective, tmp_path: Path
) -> None:
    fake.batch_status = [400]  # the batch endpoint itself says no: nothing is known about any text
    scorer = make_scorer(fake, tmp_path)
    with pytest.raises(ScorerError, match="batch request: HTTP 400 INVALID_ARGUMENT"):
        scorer.score(rows_for(TEXTS[:3]))
    assert ScoreCache(scorer.close()["cache_file"]).count_after(0) == 0


def test_backoff_on_an_unreachable_endpoint_says_what_it_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import socket

    from workers.scorers import perspective_client

    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PERSPECTIVE_API_KEY", KEY)
    monkeypatch.setattr(perspective_client, "LOG_WAIT_S", 0.0)
    params = {**FAST, "endpoint": f"http://127.0.0.1:{port}", "max_retries": 2}
    scorer = PerspectiveToxicity(params, ScorerContext(cache_dir=str(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="workers.scorers.perspective_client"):
        out = scorer.score(rows_for(TEXTS[:1]))
    assert out[0]["status"] == "retry" and out[0]["error"].startswith("transport error: ")
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert len(waits) == 2 and f"127.0.0.1:{port}" in waits[0]
    assert KEY not in " ".join(waits)

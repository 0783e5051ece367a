"""Scoring that follows generation (`harness.stages.scoring.follow`): shards scored as they appear,
each ok row exactly once, the same scores as scoring after generation."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_run import generation_row

from harness import driver
from harness.config import ConfigError, RunConfig, parse_config
from harness.stages.scoring import follow as score_follow
from harness.stages.scoring.follow import Follower, follow_scorers
from harness.stages.scoring.pool import PoolSettings, Share
from harness.stages.scoring.stage import score_run
from harness.stages.scoring.work import OkRows as FollowRows
from results.run.store import RunStore
from workers.scorers.base import ScorerContext

REPO = Path(__file__).resolve().parents[1]
DATA = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}
COLUMNS = ["job_id", "prompt", "continuation", "status"]
NOTHING = pa.array([], pa.string())


def rows(ids: range, **fields: Any) -> list[dict[str, Any]]:
    return [generation_row(f"j{i:03d}", continuation=f" was {i} and kind", **fields) for i in ids]


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for an event of the code under test (not a timing assertion: a generous bound)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.02)


def scored_on_disk(run: Path, scorer: str) -> list[str]:
    """Job ids of every score row in every shard (no deduplication: a row twice counts twice)."""
    files = sorted((run / "scores" / scorer).glob("part-*.parquet"))
    return [j for f in files for j in pq.read_table(f, columns=["job_id"])["job_id"].to_pylist()]


def drain(feed: FollowRows) -> list[str]:
    """Poll now (not when the feed's interval says), then take every chunk it has."""
    feed.poll()
    out: list[str] = []
    while (chunk := feed.next_chunk()) is not None:
        out += [r["job_id"] for r in chunk]
    return out


# ---- the feed --------------------------------------------------------------------------------
def test_the_feed_reads_each_shard_once_and_hands_out_each_ok_job_once(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_generations(rows(range(0, 5)) + rows(range(90, 92), status="error"))
    feed = FollowRows(store, COLUMNS, pa.array(["j001"]), chunk_size=3, poll_s=0.0)
    assert drain(feed) == ["j000", "j002", "j003", "j004"]  # j001 was scored before
    assert drain(feed) == []  # nothing new: None, not the end
    store.write_generations(rows(range(3, 8)))  # j003, j004 again, in another shard
    assert drain(feed) == ["j005", "j006", "j007"]
    assert len(feed.read_paths) == 2 and not feed.unreadable


def test_the_feed_reads_a_shard_only_when_its_rows_are_needed(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    for start in (0, 4, 8):
        store.write_generations(rows(range(start, start + 4)))
    feed = FollowRows(store, COLUMNS, NOTHING, chunk_size=3, poll_s=60.0)
    assert len(feed.next_chunk() or []) == 3 and len(feed.read_paths) == 1  # 3 listed
    assert len(feed.next_chunk() or []) == 3 and len(feed.read_paths) == 2
    assert sum(len(c) for c in iter(feed.next_chunk, None)) == 6 and feed.polls == 1


def test_a_shard_compacted_between_listing_and_read_is_found_in_its_new_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_generations(rows(range(0, 4)))
    feed = FollowRows(store, COLUMNS, NOTHING, chunk_size=10, poll_s=0.0)
    assert drain(feed) == [f"j{i:03d}" for i in range(4)]
    store.write_generations(rows(range(4, 8)))
    stale = store.list_shards("generations")  # a listing taken before the compaction
    assert store.compact_generations() == 2
    real = store.list_shards
    calls = iter([stale])
    monkeypatch.setattr(store, "list_shards", lambda *p: next(calls, None) or real(*p))
    # the stale listing's new shard is gone: skipped, not unreadable; its rows come from the
    # part-c- shard of a later listing, once (the first shard's rows were handed out before)
    assert drain(feed) + drain(feed) == [f"j{i:03d}" for i in range(4, 8)]
    assert feed.vanished == 1 and not feed.unreadable


# ---- who follows -----------------------------------------------------------------------------
def test_auto_follows_only_scorers_whose_pool_holds_no_gpu() -> None:
    scorers = [
        (n, {}) for n in ("gender", "sentiment-vader", "perspective", "perplexity", "regard")
    ]
    names = lambda chosen: [n for n, _ in chosen]  # noqa: E731
    assert names(follow_scorers(scorers, "auto", None, {})) == [
        "gender",
        "sentiment-vader",
        "perspective",
    ]
    on_cpu = {"perplexity": Share(num_gpus=0.0)}
    assert "perplexity" in names(follow_scorers(scorers, "auto", None, on_cpu))
    assert "gender" not in names(follow_scorers(scorers, "auto", None, {"gender": Share(1, 0.5)}))
    assert len(follow_scorers(scorers, "auto", "cpu", {})) == 5  # device: cpu: nothing on a GPU
    assert len(follow_scorers(scorers, True, None, {})) == 5
    assert follow_scorers(scorers, False, None, {}) == []


def test_rows_missing_during_generation_are_counted_once() -> None:
    """A cache-only Perspective leaves rows `missing` (no score row): the final pass hands them
    out again, so only the final pass counts them."""
    during = {"version": "v", "scored": 5, "status": {"ok": 3, "missing": 2}}
    followed = score_follow.Followed(use_ray=False, stats={"perspective": during})
    stats = {"perspective": {"version": "v", "scored": 2, "skipped": 4, "status": {"missing": 2}}}
    followed.add_to(stats)
    merged = stats["perspective"]
    assert (merged["scored"], merged["skipped"]) == (5, 1)  # 1 was scored by an earlier run
    assert merged["status"] == {"ok": 3, "missing": 2} and merged["during_generation"] is during


def test_the_setting_is_auto_true_or_false() -> None:
    base = {
        "name": "x",
        "dataset": {"kind": "paired-jsonl", "files": DATA, "limit": 1},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
    }
    for value in ("auto", True, False):
        cfg = parse_config({**base, "runtime": {"score_during_generation": value}}, "x.yaml")
        assert cfg.runtime.score_during_generation == value
    with pytest.raises(ConfigError, match="runtime.score_during_generation"):
        parse_config({**base, "runtime": {"score_during_generation": "yes"}}, "x.yaml")


# ---- a run -----------------------------------------------------------------------------------
def run_config(follow: bool | str) -> RunConfig:
    data = {
        "name": "follow",
        "dataset": {"kind": "paired-jsonl", "files": DATA, "limit": 3},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "samples_per_prompt": 2,
        "generation": {"max_new_tokens": 4},
        "scorers": ["gender", "sentiment-vader"],
        "runtime": {"device": "cpu", "batch_size": 3, "score_during_generation": follow},
        "aggregation": {"n_boot": 0, "n_perm": 0},
    }
    return parse_config(data, "follow.yaml (test)")


def test_a_run_scores_while_generating_each_row_once_and_as_after_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generation stops after its first shard until the follower has scored it: a run whose
    scorers never score during generation would fail here instead of passing by luck."""
    monkeypatch.setattr(score_follow, "FOLLOW_POLL_S", 0.05)
    followed = tmp_path / "followed"
    events: list[tuple[str, int]] = []
    real_write = RunStore.write_generations

    def write_then_wait(self: RunStore, batch: Any, kind: str = "") -> str:
        path = real_write(self, batch, kind)
        if self.uri == str(followed):
            events.append(("generated", len(events)))
            if len(events) == 1:  # the first batch: scored before the next batch is written
                ids = {r["job_id"] for r in batch if r["status"] == "ok"}
                wait_for(
                    "gender scores of batch 1",
                    lambda: ids <= set(scored_on_disk(followed, "gender")),
                )
                events.append(("scored batch 1", len(events)))
        return path

    monkeypatch.setattr(RunStore, "write_generations", write_then_wait)
    result = driver.run(run_config("auto"), str(followed), use_ray=False, progress=False)
    monkeypatch.setattr(RunStore, "write_generations", real_write)
    after = tmp_path / "after"
    baseline = driver.run(run_config(False), str(after), use_ray=False, progress=False)

    assert [e for e, _ in events][:3] == ["generated", "scored batch 1", "generated"]
    assert len(events) >= 4  # at least one more batch was generated after the scoring
    ok = set(RunStore(str(followed)).read_generations(["job_id"])["job_id"])
    assert len(ok) == 12
    for name, metric in (("gender", "gender"), ("sentiment-vader", "sentiment")):
        on_disk = scored_on_disk(followed, name)
        assert sorted(on_disk) == sorted(ok)  # none twice, none missed
        stats = result["scoring"][name]
        assert stats["scored"] == 12 and stats["skipped"] == 0
        assert stats["during_generation"]["scored"] >= 3  # batch 1 at least
        assert "during_generation" not in baseline["scoring"][name]
        mine = RunStore(str(followed)).read_scores(name, metric).sort("job_id")
        theirs = RunStore(str(after)).read_scores(name, metric).sort("job_id")
        assert mine.equals(theirs)
    names = [p.name for p in (followed / "generations").glob("*.parquet")]
    assert names and all(n.startswith("part-c-") for n in names)  # compacted after following


def test_an_error_in_the_follower_is_raised_when_generation_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_generations(rows(range(3)))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("feed broke")

    monkeypatch.setattr(score_follow, "new_work", broken)
    follower = Follower(store.uri, [("gender", {})], ScorerContext(), use_ray=False, poll_s=0.01)
    follower.start()
    with pytest.raises(RuntimeError, match="feed broke"):
        follower.finish()
    assert not follower.result.live  # closed


def test_when_generation_raises_the_follower_stops_and_closes_its_scorers(
    tmp_path: Path,
) -> None:
    cfg = run_config("auto")
    store = RunStore(str(tmp_path / "run"))
    store.write_generations(rows(range(3)))
    holder: list[Any] = []
    with pytest.raises(KeyError, match="generation failed"):
        with score_follow.following(
            store, cfg, driver.load_words(cfg), use_ray=False, poll_s=0.01
        ) as follower:
            holder.append(follower)
            wait_for("a first score", lambda: bool(scored_on_disk(tmp_path / "run", "gender")))
            raise KeyError("generation failed")
    assert not holder[0].result.live and not holder[0]._thread.is_alive()


def test_perspective_keeps_one_scorer_and_asks_each_text_once_across_both_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rate limiter and one cache from the first shard to the last: the scorer that
    followed generation is the one the final pass closes (its counts cover both passes)."""
    from fake_perspective import FakePerspective

    key = "AIzaSy-follow-secret-0123456789"
    monkeypatch.setenv("PERSPECTIVE_API_KEY", key)
    monkeypatch.delenv("PERSPECTIVE_API_ENDPOINT", raising=False)
    run = tmp_path / "run"
    store = RunStore(str(run))
    store.write_generations(rows(range(0, 4)))
    ctx = ScorerContext(cache_dir=str(tmp_path / "cache"))
    with FakePerspective(api_key=key) as fake:
        params = {"endpoint": fake.endpoint, "qps": 20.0, "quota_window_s": 1.0, "progress": False}
        follower = Follower(store.uri, [("perspective", params)], ctx, use_ray=False, poll_s=0.01)
        follower.start()
        try:
            wait_for("the first shard scored", lambda: len(scored_on_disk(run, "perspective")) == 4)
        finally:
            followed = follower.finish()
        store.write_generations(rows(range(4, 7)))
        stats = score_run(
            store, [("perspective", params)], ctx, use_ray=False, progress=False, followed=followed
        )["perspective"]
        answered = dict(fake.answered)
    assert stats["scorer"]["sent"] == 7 and stats["scored"] == 7  # one scorer, both passes
    assert stats["during_generation"]["scored"] == 4
    assert sorted(answered.values()) == [1] * 7
    assert sorted(scored_on_disk(run, "perspective")) == [f"j{i:03d}" for i in range(7)]


# ---- on Ray: the thread drives actors, and the final pass takes them over --------------------
def test_on_ray_the_final_pass_takes_over_the_actors_that_followed(
    ray_local: None, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    store = RunStore(str(run))
    store.write_generations(rows(range(0, 4)))
    follower = Follower(
        store.uri,
        [("gender", {})],
        ScorerContext(),
        use_ray=True,
        batch_size=2,
        poll_s=0.05,
        settings=PoolSettings(flush_rows=2),  # each chunk written at once: seen mid-follow
        start_timeout_s=120,
    )
    follower.start()
    try:
        wait_for("scores of the first shard", lambda: len(scored_on_disk(run, "gender")) == 4)
        store.write_generations(rows(range(2, 6)))  # j002, j003 again: scored once
    finally:
        followed = follower.finish()
    store.write_generations(rows(range(6, 9)))  # written after the follower stopped
    stats = score_run(
        store,
        [("gender", {})],
        ScorerContext(),
        use_ray=True,
        batch_size=2,
        progress=False,
        followed=followed,
    )["gender"]
    assert sorted(scored_on_disk(run, "gender")) == [f"j{i:03d}" for i in range(9)]
    assert stats["scored"] == 9 and stats["during_generation"]["scored"] >= 4
    [actor] = stats["actors"]  # one actor from the first shard to the last
    assert actor["rows"] == 9 and actor["end"] == "released"
    assert not followed.live
    # the actor held its rows and wrote them itself: one shard per pass, compacted into one
    assert len(store.list_shards("scores", "gender")) == 1


def test_a_run_without_following_starts_no_thread(tmp_path: Path) -> None:
    cfg = run_config(False)
    store = RunStore(str(tmp_path / "run"))
    before = threading.active_count()
    with score_follow.following(store, cfg, driver.load_words(cfg), use_ray=False) as follower:
        assert threading.active_count() == before and follower._thread.ident is None
    assert follower.result.stats == {} and follower.result.live == {}


def test_in_process_a_tuned_method_runs_while_perplexity_loads_and_follows(tmp_path: Path) -> None:
    """`run --no-ray`: the generator (LIDAO-min) loads in the driver's thread while perplexity
    loads in the follower's. A fresh process, so that transformers' lazy modules are not
    imported yet: building both at once failed every time ("cannot import name
    'AutoModelForCausalLM'", 0 of 24 generated) before construction was serialised."""
    import yaml
    from cli_run import harness

    cfg = {
        "name": "threads",
        "dataset": {"kind": "paired-jsonl", "files": DATA, "limit": 2},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla", "lidao-min"],
        "tasks": ["sentiment"],
        "samples_per_prompt": 3,
        "generation": {"max_new_tokens": 3},
        "scorers": [
            "gender",
            "sentiment-vader",
            {"name": "perplexity", "params": {"model": "tiny-random/gpt2"}},
        ],
        "runtime": {"device": "cpu", "batch_size": 2, "score_during_generation": True},
        "aggregation": {"n_boot": 0, "n_perm": 0},
    }
    path, out = tmp_path / "c.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(cfg))
    res = harness("run", str(path), "--out", str(out), "--no-ray", "--no-progress")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "scoring during generation: gender, sentiment-vader, perplexity" in res.stderr
    store = RunStore(str(out))
    gen = store.read_generations(["job_id", "status"])
    assert gen.height == 24 and set(gen["status"]) == {"ok"}
    scored = store.read_scores("perplexity", "perplexity")
    assert sorted(scored["job_id"]) == sorted(gen["job_id"])

"""Ray-free rules of cluster placement and pooled scoring: the GPU pools' wait, pool sizes, chunk
retries, actors that keep dying, the streamed feed of rows, and the Perspective cache kept with
the run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from fake_run import generation_row

import harness.stages.scoring.loop as loop
import harness.stages.scoring.stage as scoring
from harness.config import ModelConfig
from harness.stages.generation.backends import Placement
from harness.stages.generation.stage import placement
from harness.stages.scoring.pool import Pool, PoolActor, PoolSettings, Share, pool_plans
from harness.stages.scoring.stage import ScoringError, score_run
from harness.stages.scoring.work import SCORE_INPUT_COLUMNS, OkRows, new_work
from results.run.store import RunStore
from workers.scorers.base import Scorer, ScorerContext, ScorerError
from workers.scorers.cache_mirror import CacheMirror, scorer_context

CTX = ScorerContext(device="cpu")


def fake_run(root: Path, n: int, per_shard: int = 8) -> RunStore:
    store = RunStore(str(root))
    rows = [
        generation_row(f"j{i:03d}", continuation=f" said {i}", token_ids=list(range(50)))
        for i in range(n)
    ]
    for start in range(0, n, per_shard):
        store.write_generations(rows[start : start + per_shard])
    return store


# ---- waiting for the GPU pools' placement groups (harness/stages/generation/reservation.py) --


class FakeGroups:
    """Placement groups placed at given (fake) times; the clock advances when the waiter
    sleeps. `lost_at`: from then on the cluster has lost GPUs and holds `fits` actors."""

    def __init__(self, at: dict[str, float], lost_at: float | None = None, fits: int = 0) -> None:
        self.now, self.at, self.lost_at, self.fit = 0.0, at, lost_at, fits

    def placed(self, groups: list[str]) -> list[str]:
        return [g for g in groups if self.at.get(g, float("inf")) <= self.now]

    def fits(self) -> dict[str, int] | None:
        lost = self.lost_at is not None and self.now >= self.lost_at
        return {"perplexity": self.fit} if lost else None

    def settle(self, wait_s: float) -> list[str]:
        from harness.stages.generation.reservation import settle

        done = settle(
            {"perplexity": ["g0", "g1", "g2"]}, wait_s, "pools", self.placed, self.fits,
            clock=lambda: self.now, sleep=lambda s: setattr(self, "now", self.now + s),
        )  # fmt: skip
        return done["perplexity"]


def test_a_gpu_pool_starts_once_its_groups_are_placed() -> None:
    groups = FakeGroups({"g0": 0.0, "g1": 30.0, "g2": 95.0})
    assert groups.settle(900) == ["g0", "g1", "g2"] and groups.now == 95


def test_without_a_node_loss_a_pool_waits_for_every_group_then_goes_on_with_the_placed() -> None:
    groups = FakeGroups({"g0": 0.0, "g1": 10.0})
    assert groups.settle(60) == ["g0", "g1"] and groups.now == 60
    assert FakeGroups({}).settle(5) == []


def test_after_a_node_loss_a_pool_goes_on_as_soon_as_the_gpus_left_hold_it() -> None:
    """Three 1-GPU actors, a node lost at 4 s: re-planned for the 2 GPUs left (two actors), the
    pool goes on when both are placed, not after the 900 s wait."""
    groups = FakeGroups({"g0": 0.0, "g1": 7.0}, lost_at=4.0, fits=2)
    assert groups.settle(900) == ["g0", "g1"] and groups.now == 7
    fractional = FakeGroups({"g0": 0.0, "g1": 0.0, "g2": 1.0}, lost_at=0.0, fits=2)
    assert fractional.settle(900) == ["g0", "g1"] and fractional.now == 0  # the plan fits now


@pytest.mark.parametrize(
    ("entry", "gpus", "device", "expected"),
    [
        ({}, 0.0, "cpu", (1, 0.0, 1.0, "cpu")),
        ({"num_cpus": 8}, 4.0, "cpu", (1, 0.0, 8.0, "cpu")),  # device cpu: no GPU share
        ({"num_gpus": 1}, 3.0, "cpu", (3, 1.0, 1.0, "cpu")),  # explicit share kept (tests)
        ({"num_cpus": 4}, 2.0, None, (2, 1.0, 4.0, "cuda")),
    ],
)
def test_placement_takes_cpus_and_the_device_from_the_config(
    entry: dict[str, Any], gpus: float, device: str | None, expected: tuple[Any, ...]
) -> None:
    p = placement(ModelConfig(id="m", **entry), gpus, device)
    assert (p.replicas, p.num_gpus, p.num_cpus, p.device) == expected


# ---- pool sizes ----------------------------------------------------------------------------

SCORERS = [("perplexity", {}), ("toxicity-hf", {}), ("gender", {}), ("perspective", {})]


def test_gpu_scorers_get_one_actor_per_gpu_sharing_each_gpu() -> None:
    plans = pool_plans(SCORERS, ScorerContext(), PoolSettings(), gpus=3)
    assert (plans["perplexity"].replicas, plans["perplexity"].num_gpus) == (3, 0.5)
    assert (plans["toxicity-hf"].replicas, plans["toxicity-hf"].num_gpus) == (3, 0.5)
    assert (plans["gender"].replicas, plans["gender"].num_gpus) == (1, 0.0)
    assert (plans["perspective"].replicas, plans["perspective"].num_gpus) == (1, 0.0)


def test_pool_shares_from_the_config_and_device_cpu() -> None:
    settings = PoolSettings(shares={"perplexity": Share(replicas=2, num_gpus=1.0)})
    plans = pool_plans(SCORERS, ScorerContext(device="cpu"), settings, gpus=8)
    assert (plans["perplexity"].replicas, plans["perplexity"].num_gpus) == (2, 1.0)
    assert plans["toxicity-hf"].num_gpus == 0.0 and plans["toxicity-hf"].replicas == 1


# ---- chunks: retries and streaming ---------------------------------------------------------


class FlakyScorer(Scorer):
    """sentiment 0.5 for every row; fails on chosen job ids (once, or always)."""

    name = "sentiment-vader"
    metric = "sentiment"
    fail_once: ClassVar[set[str]] = set()
    always: ClassVar[set[str]] = set()
    fatal: ClassVar[bool] = False
    calls: ClassVar[int] = 0

    @property
    def version(self) -> str:
        return "flaky/1"

    def score(self, rows: Any) -> list[dict[str, Any]]:
        FlakyScorer.calls += 1
        ids = {r["job_id"] for r in rows}
        if self.fatal:
            raise ScorerError("the API refused the request")
        if ids & self.always:
            raise RuntimeError("this chunk always fails")
        if ids & self.fail_once:
            FlakyScorer.fail_once -= ids
            raise RuntimeError("a passing failure")
        return [dict(self.key(r), sentiment=0.5) for r in rows]


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> type[FlakyScorer]:
    monkeypatch.setattr(scoring, "load_scorer", lambda name: FlakyScorer)
    FlakyScorer.fail_once, FlakyScorer.always, FlakyScorer.fatal = set(), set(), False
    FlakyScorer.calls = 0
    return FlakyScorer


def test_a_failed_chunk_is_retried_and_one_that_keeps_failing_stays_unscored(
    tmp_path: Path, flaky: type[FlakyScorer]
) -> None:
    store = fake_run(tmp_path / "run", 12)
    flaky.fail_once, flaky.always = {"j001"}, {"j010"}
    with pytest.raises(ScoringError, match=r"1 chunk\(s\) \(4 rows\) failed 3 times") as err:
        score_run(store, [("sentiment-vader", {})], CTX, use_ray=False, batch_size=4,
                  progress=False)  # fmt: skip
    stats = err.value.stats["sentiment-vader"]
    assert stats["scored"] == 8 and stats["failed_chunks"] == 1
    scored = set(store.read_scores("sentiment-vader", "sentiment")["job_id"])
    assert len(scored) == 8 and "j001" in scored and "j010" not in scored
    flaky.always = set()  # fixed: the next `score` does only what is left
    again = score_run(store, [("sentiment-vader", {})], CTX, use_ray=False, progress=False)
    assert again["sentiment-vader"]["scored"] == 4 and again["sentiment-vader"]["skipped"] == 8


def test_a_scorer_error_stops_the_scorer_without_retries(
    tmp_path: Path, flaky: type[FlakyScorer]
) -> None:
    store = fake_run(tmp_path / "run", 12)
    flaky.fatal = True
    with pytest.raises(ScoringError, match="ScorerError: the API refused"):
        score_run(store, [("sentiment-vader", {})], CTX, use_ray=False, batch_size=4,
                  progress=False)  # fmt: skip
    assert flaky.calls == 1


def test_the_feed_streams_only_the_needed_columns_of_unscored_ok_rows(tmp_path: Path) -> None:
    store = fake_run(tmp_path / "run", 20, per_shard=5)
    store.write_generations([generation_row("j003", continuation=" again")])  # a 2nd copy
    store.write_generations([generation_row("x000", status="error", continuation=None)])
    feed = OkRows(store, list(SCORE_INPUT_COLUMNS), pa.array(["j000", "j001"]), chunk_size=4)
    first = feed.next_chunk()
    assert first is not None and len(first) == 4 and feed.rows == 4  # nothing read ahead
    assert set(first[0]) == set(SCORE_INPUT_COLUMNS)  # no token_ids, tokens, losses...
    ids = [r["job_id"] for r in first]
    while (chunk := feed.next_chunk()) is not None:
        ids += [r["job_id"] for r in chunk]
    assert sorted(ids) == [f"j{i:03d}" for i in range(2, 20)]  # once each, ok only


# ---- the Perspective cache lives with the run (on S3: tests/test_perspective_cache.py) -------


def test_a_local_run_holds_the_cache_itself(tmp_path: Path) -> None:
    mirror = CacheMirror(str(tmp_path / "run"), "perspective-scores.sqlite")
    assert mirror.dir == str(tmp_path / "run" / "cache")
    ctx, _ = scorer_context("perspective", {}, ScorerContext(), str(tmp_path / "run"))
    assert ctx.cache_dir == mirror.dir
    shared = ScorerContext(cache_dir="/shared/cache")
    assert scorer_context("perspective", {}, shared, "s3://b/r")[0] is shared
    assert scorer_context("gender", {}, ScorerContext(), "s3://b/r")[1] is None


# ---- the loop's supervision, with fake actors (no Ray cluster) ------------------------------


class DyingHandle:
    """A `ScorerActor` handle whose actor is dead: every call's ref raises `RayActorError`."""

    def __getattr__(self, method: str) -> Any:
        return SimpleNamespace(remote=lambda *args: object())


def test_actors_that_die_until_chunks_are_given_up_stop_the_scorer_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots of three lives (two replacements each), no chunk retry: the fifth death gives
    up a fifth chunk in a row, which stops the pool while its actor was being replaced. The
    loop ends with the scorer's failure named (exit 1), not a `list.remove` ValueError (exit 2:
    "bad input", every other scorer's pool closed with its work undone)."""
    import ray
    from ray import exceptions as rex

    store = fake_run(tmp_path / "run", 12)
    monkeypatch.setattr(loop, "ray_ready", lambda refs, timeout: list(refs))
    monkeypatch.setattr(loop, "new_actor", lambda pool, slot, uri: PoolActor(DyingHandle(), slot))
    monkeypatch.setattr(ray, "kill", lambda handle, no_restart=True: None)

    def dead(ref: Any) -> Any:
        raise rex.RayActorError()

    monkeypatch.setattr(ray, "get", dead)
    pool = Pool("gender", {}, Placement(2, 0.0, 1.0), CTX)
    pool.actors = [PoolActor(DyingHandle(), slot) for slot in range(2)]
    settings = PoolSettings(chunk_retries=0)
    work = lambda p: new_work(store, p.name, "v", 1, False, 0)  # noqa: E731
    loop.ScoreLoop(store, [pool], settings, work).run()
    assert pool.error is not None and pool.error.startswith("5 chunks in a row failed")
    assert pool.actors == [] and pool.work is not None and pool.work.failed_chunks == 5

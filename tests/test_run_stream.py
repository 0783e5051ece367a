"""The streaming plan through the real `run` path (no Ray, no model): the driver holds a bounded
number of jobs whatever the grid's size, counts stay right, resume and plan identity behave as
before, and the dispatcher pulls batches from its source lazily."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import jobs.grid
from harness import driver
from harness.config import RunConfig, load_config
from harness.stages.generation import planning
from harness.stages.generation import stage as generation
from harness.stages.generation.backends import ActorSpec, Batch, LocalBackend, Placement
from harness.stages.generation.dispatch import PIPELINE, Dispatcher
from harness.stages.generation.dispatch_state import ModelWork, Policy
from harness.stages.generation.stage import GenerationError
from jobs.spec import JobSpec
from results.run.identity import PlanChangedError
from results.run.store import RunStore
from tests.fake_dispatch import Clock, FakeBackend, Script
from tests.helpers import make_jobs

REPO = Path(__file__).resolve().parents[1]


class Live:
    """Counts `JobSpec`s alive in this process (made by the planner) and the peak."""

    now = 0
    peak = 0


class CountedJobSpec(JobSpec):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Live.now += 1
        Live.peak = max(Live.peak, Live.now)

    def __del__(self) -> None:
        Live.now -= 1


class FakeGenerator:
    """Writes an ok row per job, as a `Generator` would, without a model."""

    calls: collections.Counter[str] = collections.Counter()

    def __init__(self, spec: ActorSpec, run_uri: str) -> None:
        self.store, self.model = RunStore(run_uri), spec.model.id

    def prepare(self, keys: list[Any]) -> dict[str, Any]:
        return {"device": "cpu"}

    def run_batch(self, batch: Batch) -> dict[str, Any]:
        rows = []
        for job in batch:
            FakeGenerator.calls[job.job_id] += 1
            rows.append({**job.to_row(), "continuation": " and she went home", "status": "ok"})
        self.store.write_generations(rows)
        return {"jobs": len(batch), "ok": len(batch), "tokens": 4 * len(batch), "busy_s": 0.0}


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks (so that many jobs are many chunks), counted specs, a fake generator."""
    monkeypatch.setattr(jobs.grid, "JobSpec", CountedJobSpec)
    monkeypatch.setattr(planning, "CHUNK_SIZE", 100)
    monkeypatch.setattr(generation, "feed_chunk", lambda batch_size, replicas: 60)
    monkeypatch.setattr(
        generation,
        "_local_backend",
        lambda store, words: LocalBackend(lambda spec: FakeGenerator(spec, store.uri)),
    )
    FakeGenerator.calls.clear()
    Live.now = Live.peak = 0


def tiny_cfg(tmp_path: Path, samples: int, max_new_tokens: int = 4) -> RunConfig:
    files = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}
    data = {
        "name": "stream",
        "dataset": {"kind": "paired-jsonl", "files": files, "limit": 10},
        "models": [{"id": "tiny-random/gpt2"}, {"id": "tiny-random/opt"}],
        "methods": ["vanilla", "uddia"],
        "tasks": ["sentiment"],
        "samples_per_prompt": samples,
        "generation": {"max_new_tokens": max_new_tokens},
        "scorers": ["gender"],
        "aggregation": {"n_boot": 5, "n_perm": 0},
        "runtime": {"batch_size": 8},
    }
    import yaml

    path = tmp_path / f"cfg-{samples}-{max_new_tokens}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def all_ids(cfg: RunConfig) -> list[str]:
    return [j.job_id for j in planning.plan(cfg, driver.load_words(cfg))]


def test_run_holds_a_bounded_number_of_jobs_and_counts_right(
    tmp_path: Path, streamed: None
) -> None:
    cfg = tiny_cfg(tmp_path, samples=25)  # 20 prompts × 2 models × 2 methods × 25 = 2000 jobs
    out = str(tmp_path / "run")
    result = driver.run(cfg, out, use_ray=False, progress=False)
    n = 20 * 2 * 2 * 25
    # plan: a chunk of 100 (and the one being built); generation: per model a chunk of 60
    # expanded, its pending jobs, batches and those in flight. Never the grid.
    assert Live.peak <= 400 < n // 4, Live.peak
    assert result["jobs"] == n
    assert result["generation"]["planned"] == n and result["generation"]["pending_at_start"] == n
    ids = all_ids(cfg)
    assert sorted(FakeGenerator.calls) == sorted(ids)
    assert set(FakeGenerator.calls.values()) == {1}  # every job generated once
    store = RunStore(out)
    assert store.read_plan(["job_id"])["job_id"].to_list() == ids  # plan order, every job
    gens = store.read_generations(["job_id", "status"])
    assert gens.height == n and (gens["status"] == "ok").all()
    assert store.exists("summary.parquet")
    models = result["generation"]["models"]
    assert {m: s["done"] for m, s in models.items()} == {
        "tiny-random/gpt2": n // 2,
        "tiny-random/opt": n // 2,
    }

    # Resume: nothing pending, nothing generated, the same bound.
    FakeGenerator.calls.clear()
    Live.peak = Live.now
    again = driver.run(cfg, out, use_ray=False, progress=False)
    assert again["jobs"] == n and again["generation"]["pending_at_start"] == 0
    assert not FakeGenerator.calls and Live.peak <= Live.now + 400


def test_a_partial_resume_fills_its_batches_and_generates_only_what_is_missing(
    tmp_path: Path, streamed: None
) -> None:
    cfg = tiny_cfg(tmp_path, samples=10)  # 800 jobs
    out = str(tmp_path / "run")
    store = RunStore(out)
    driver.run(cfg, out, use_ray=False, progress=False)
    gens = store.read_generations()
    keep = gens.filter(pl.col("seed") % 3 != 0)  # a third of the jobs lost
    for path in store.list_shards("generations"):
        store.delete(path)
    store.write_generations(keep.to_dicts())
    FakeGenerator.calls.clear()
    batches: list[int] = []
    real = FakeGenerator.run_batch

    def spy(self: FakeGenerator, batch: Batch) -> dict[str, Any]:
        batches.append(len(batch))
        return real(self, batch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FakeGenerator, "run_batch", spy)
        result = driver.run(cfg, out, use_ray=False, progress=False)
    lost = gens.height - keep.height
    assert result["generation"]["pending_at_start"] == lost
    assert sum(FakeGenerator.calls.values()) == lost == len(FakeGenerator.calls)
    # pending jobs are regrouped across the plan's chunks: at most one short batch per slice
    assert sum(1 for b in batches if b < 8) <= 4
    assert store.read_generations(["job_id"]).height == gens.height


def test_plan_identity_through_the_stream_extends_or_refuses_leaving_the_plan(
    tmp_path: Path, streamed: None
) -> None:
    out = str(tmp_path / "run")
    store = RunStore(out)
    small = tiny_cfg(tmp_path, samples=2)
    driver.run(small, out, use_ray=False, progress=False)
    plan_before = Path(store.path("plan.parquet")).read_bytes()
    config_before = store.read_text("config.yaml")

    changed = tiny_cfg(tmp_path, samples=2, max_new_tokens=5)
    with pytest.raises(PlanChangedError, match=r"generation.max_new_tokens 4 → 5") as err:
        driver.run(changed, out, use_ray=False, progress=False)
    assert "changes or drops 160 of its 160 planned jobs" in str(err.value)
    assert Path(store.path("plan.parquet")).read_bytes() == plan_before  # never replaced
    assert store.read_text("config.yaml") == config_before
    assert not [p for p in store.list_shards() if ".tmp-" in p]

    bigger = tiny_cfg(tmp_path, samples=3)  # one more seed: extends
    FakeGenerator.calls.clear()
    result = driver.run(bigger, out, use_ray=False, progress=False)
    assert result["jobs"] == 240 and result["generation"]["pending_at_start"] == 80
    assert len(FakeGenerator.calls) == 80
    assert store.read_plan(["job_id"])["job_id"].to_list() == all_ids(bigger)

    replanned = driver.run(changed, out, use_ray=False, progress=False, replan=True)
    assert replanned["jobs"] == 160 and replanned["generation"]["pending_at_start"] == 160
    assert store.read_plan(["job_id"])["job_id"].to_list() == all_ids(changed)


def test_the_dispatcher_pulls_batches_lazily_and_keeps_its_rules() -> None:
    """A source of 300 batches: at any time at most replicas × PIPELINE batches held by actors
    plus one pulled ahead (and a retried one); a batch whose actor dies goes back to the front
    and runs next; every actor is released once the source is dry."""
    jobs_ = make_jobs(n=600)
    script = Script(Clock(), kill_on={jobs_[101].prompt_id: 1})
    pulled = finished = worst = pulled_at_death = 0

    def source() -> Iterator[Batch]:
        nonlocal pulled, worst
        for i in range(0, len(jobs_), 2):
            pulled += 1
            worst = max(worst, pulled - finished)
            yield jobs_[i : i + 2]

    def count(event: str, details: dict[str, Any]) -> None:
        nonlocal finished, pulled_at_death
        finished += event == "batch_done"
        if event == "actor_died":
            pulled_at_death = pulled

    work = ModelWork(
        jobs_[0].model,
        [("vanilla", "{}", "sentiment")],
        Placement(3, 0.0, 1.0, "cpu"),
        collections.deque(),
        total=len(jobs_),
        source=source(),
    )
    failed: list[Batch] = []
    d = Dispatcher(
        [work],
        FakeBackend(script),
        Policy(log_every_s=5.0, max_batch_retries=1),
        lambda batch, error: failed.append(batch) or len(batch),
        observer=count,
        clock=script.clock,
    )
    d.run()
    assert not failed and work.done == len(jobs_) and pulled == 300 and finished == 300
    assert all(script.written[j.job_id] == 1 for j in jobs_)
    assert worst <= 3 * PIPELINE + 2, worst
    runs = [e for e in script.events if e[0] == "run"]
    died = next(i for i, e in enumerate(runs) if jobs_[101].prompt_id in e)
    again = next(i for i, e in enumerate(runs[died + 1 :], died + 1) if jobs_[101].prompt_id in e)
    between = [int(e[2].split(":")[1]) // 2 for e in runs[died + 1 : again]]
    assert all(i < pulled_at_death for i in between)  # the retry went before the source's batches
    ends = [a["end"] for a in d.actor_stats()]
    assert ends.count("released") == 3 and sum(e.startswith("died") for e in ends) == 1


def test_a_model_that_cannot_start_leaves_its_jobs_pending_and_the_rest_is_aggregated(
    tmp_path: Path, streamed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = FakeGenerator.prepare

    def prepare(self: FakeGenerator, keys: list[Any]) -> dict[str, Any]:
        if self.model == "tiny-random/opt":
            raise OSError("tiny-random/opt: no such model on this node")
        return real(self, keys)

    monkeypatch.setattr(FakeGenerator, "prepare", prepare)
    cfg = tiny_cfg(tmp_path, samples=2)  # 160 jobs, 80 per model
    out = str(tmp_path / "run")
    with pytest.raises(GenerationError, match="no such model on this node"):
        driver.run(cfg, out, use_ray=False, progress=False)
    store = RunStore(out)
    gens = store.read_generations(["model", "status"])
    assert gens.height == 80 and set(gens["model"]) == {"tiny-random/gpt2"}  # opt: pending
    assert set(pl.read_parquet(store.path("summary.parquet"))["model"]) == {"tiny-random/gpt2"}
    assert store.read_scores("gender", "gender").height == 80
    assert store.generation_counts().filter(pl.col("model") == "tiny-random/opt")[
        "pending"
    ].to_list() == [40, 40]

"""The dispatcher's fault handling, without Ray: scripted actors that die, raise or never start.

Every test runs `harness.dispatch.Dispatcher` over `LocalBackend` with fake generators and a
fake clock; `tests/test_cluster.py` checks the same rules against real Ray actors.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.backends import ActorLost, ActorSpec, Batch, LocalBackend, Placement
from harness.config import ModelConfig
from harness.dispatch import Dispatcher, ModelWork, Policy
from harness.generation import _fail_batch, _model_stats, batch_jobs, failed_row, placement
from jobs.queue import make_batches
from jobs.spec import JOB_ID_VERSION, JobSpec, ModelRef
from results.store import RunStore
from tests.helpers import make_jobs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Script:
    """What the fake actors do, and a log of what they did."""

    clock: Clock
    kill_on: dict[str, int] = dataclasses.field(default_factory=dict)  # prompt id → deaths left
    raise_on: set[str] = dataclasses.field(default_factory=set)  # prompt ids that always raise
    bad_models: set[str] = dataclasses.field(default_factory=set)  # prepare raises
    die_loading: dict[str, int] = dataclasses.field(default_factory=dict)  # actor name → deaths
    never_start: set[str] = dataclasses.field(default_factory=set)  # model ids
    events: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    written: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


class FakeGenerator:
    def __init__(self, spec: ActorSpec, script: Script) -> None:
        self.spec, self.script, self.dead = spec, script, False

    def prepare(self, keys: list[Any]) -> dict[str, Any]:
        slot = self.spec.name.split(".")[0]
        if self.spec.model.id in self.script.bad_models:
            raise ValueError(f"no model named {self.spec.model.id}")
        if self.script.die_loading.get(slot, 0) > 0:
            self.script.die_loading[slot] -= 1
            raise ActorLost("killed while loading")
        return {"device": "cpu", "pid": id(self)}

    def run_batch(self, batch: Batch) -> dict[str, Any]:
        if self.dead:
            raise ActorLost("actor is dead")
        ids = [j.prompt_id for j in batch]
        self.script.events.append(("run", self.spec.name, *ids))
        for pid in ids:
            if self.script.kill_on.get(pid, 0) > 0:
                self.script.kill_on[pid] -= 1
                self.dead = True
                raise ActorLost("SIGKILL")
        if self.script.raise_on & set(ids):
            raise RuntimeError("boom")
        self.script.clock.now += 1.0  # one second of work per batch
        self.script.written.update(j.job_id for j in batch)
        return {"jobs": len(batch), "ok": len(batch), "tokens": 10 * len(batch), "busy_s": 1.0}


class Never:
    """A call that never finishes (an actor waiting for resources no node has)."""


class FakeBackend(LocalBackend):
    def __init__(self, script: Script) -> None:
        super().__init__(lambda spec: FakeGenerator(spec, script))
        self.script = script

    def prepare(self, actor: Any, keys: Sequence[Any]) -> Any:
        if actor.spec.model.id in self.script.never_start:
            return Never()
        return super().prepare(actor, keys)

    def wait(self, futures: Sequence[Any], timeout: float) -> list[Any]:
        done = [f for f in futures if not isinstance(f, Never)]
        if not done:
            self.script.clock.now += max(timeout, 1.0)
        return done

    def kill(self, actor: Any) -> None:
        self.script.events.append(("kill", actor.spec.name))


def work(jobs: list[JobSpec], replicas: int = 2, batch_size: int = 2) -> ModelWork:
    batches = collections.deque((b, 0) for b in make_batches(jobs, batch_size))
    keys = sorted({(j.method, j.method_params, j.task) for j in jobs})
    return ModelWork(
        jobs[0].model, keys, Placement(replicas, 0.0, 1.0, "cpu"), batches, total=len(jobs)
    )


def dispatch(
    works: list[ModelWork], script: Script, **policy: Any
) -> tuple[Dispatcher, list[tuple[Batch, str]]]:
    failed: list[tuple[Batch, str]] = []

    def fail(batch: Batch, error: str) -> int:
        failed.append((batch, error))
        return len(batch)

    d = Dispatcher(
        works,
        FakeBackend(script),
        Policy(**{"log_every_s": 5.0, **policy}),
        fail,
        clock=script.clock,
    )
    d.run()
    return d, failed


def on_model(model: str, n: int = 8) -> list[JobSpec]:
    return [dataclasses.replace(j, model=ModelRef(model)) for j in make_jobs(n=n)]


def test_every_job_runs_once_and_the_work_spreads_over_the_replicas() -> None:
    script = Script(Clock())
    d, failed = dispatch([work(make_jobs(n=12), replicas=3)], script)
    jobs = make_jobs(n=12)
    assert not failed and all(script.written[j.job_id] == 1 for j in jobs)
    per_actor = collections.Counter(e[1] for e in script.events if e[0] == "run")
    assert sorted(per_actor) == ["tiny-random/gpt2#0", "tiny-random/gpt2#1", "tiny-random/gpt2#2"]
    stats = d.actor_stats()
    assert sum(a["jobs"] for a in stats) == 12 and sum(a["tokens"] for a in stats) == 120
    assert all(a["end"] == "released" and 0 < a["utilisation"] <= 1 for a in stats)


def test_a_dead_actor_is_replaced_and_only_its_running_batch_is_charged() -> None:
    jobs = make_jobs(n=8)
    victim = make_batches(jobs, 2)[0][0].prompt_id  # in the first batch handed out
    script = Script(Clock(), kill_on={victim: 1})
    d, failed = dispatch([work(jobs, replicas=1)], script, max_batch_retries=1)
    assert not failed and all(script.written[j.job_id] == 1 for j in jobs)
    ends = {a["worker"]: a["end"] for a in d.actor_stats()}
    assert ends["tiny-random/gpt2#0"].startswith("died: SIGKILL")
    assert ends["tiny-random/gpt2#0.1"] == "released"  # the restarted replica finished the queue


def test_a_batch_that_keeps_failing_becomes_error_rows_and_the_rest_finishes() -> None:
    jobs = make_jobs(n=8)
    poison = make_batches(jobs, 2)[1]
    script = Script(Clock(), raise_on={poison[0].prompt_id})
    d, failed = dispatch([work(jobs)], script, max_batch_retries=2)
    assert [b for b, _ in failed] == [poison] and "RuntimeError: boom" in failed[0][1]
    runs = [e for e in script.events if e[0] == "run" and poison[0].prompt_id in e]
    assert len(runs) == 3  # first try + 2 retries
    others = [j for j in jobs if j not in poison]
    assert all(script.written[j.job_id] == 1 for j in others)
    assert d.works[0].done == 6 and d.works[0].failed == 2 and d.works[0].error is None


def test_a_batch_that_kills_every_actor_is_recorded_failed_and_the_model_goes_on() -> None:
    jobs = make_jobs(n=8)
    poison = make_batches(jobs, 2)[0]
    script = Script(Clock(), kill_on={poison[0].prompt_id: 99})
    d, failed = dispatch(
        [work(jobs, replicas=1)], script, max_batch_retries=2, max_actor_restarts=0
    )
    assert [b for b, _ in failed] == [poison] and "died: SIGKILL" in failed[0][1]
    assert all(script.written[j.job_id] == 1 for j in jobs if j not in poison)
    assert d.works[0].error is None  # deaths while running a batch are bounded by its retries


@pytest.mark.parametrize("deaths", [2, 5])
def test_a_replica_that_dies_while_loading_is_restarted_at_most_max_actor_restarts_times(
    deaths: int,
) -> None:
    script = Script(Clock(), die_loading={"tiny-random/gpt2#0": deaths})
    d, failed = dispatch([work(make_jobs(n=8), replicas=1)], script, max_actor_restarts=2)
    names = [a["worker"] for a in d.actor_stats()]
    assert names == ["tiny-random/gpt2#0", "tiny-random/gpt2#0.1", "tiny-random/gpt2#0.2"]
    if deaths == 2:  # the third start worked
        assert d.works[0].error is None and sum(script.written.values()) == 8
    else:  # retired: nothing left to run the model; its jobs stay pending, not failed
        assert not failed and not script.written
        assert (
            "no generation actor left for model tiny-random/gpt2 (last: died: killed while loading)"
            in str(d.works[0].error)
        )


def test_a_model_that_cannot_load_stays_pending_while_the_others_finish() -> None:
    good, bad = on_model("tiny-random/opt"), on_model("no/such-model")
    script = Script(Clock(), bad_models={"no/such-model"})
    d, failed = dispatch([work(bad), work(good)], script)
    assert not failed and all(script.written[j.job_id] == 1 for j in good)
    assert not any(script.written[j.job_id] for j in bad)
    assert (
        d.works[0].error is not None
        and "no/such-model cannot start: ValueError" in d.works[0].error
    )


def test_an_actor_that_never_gets_resources_times_out_and_its_jobs_stay_pending() -> None:
    script = Script(Clock(), never_start={"big/model"})
    d, failed = dispatch(
        [work(on_model("big/model")), work(make_jobs(n=4))], script, start_timeout_s=60.0
    )
    assert not failed and sum(script.written.values()) == 4
    assert "no generation actor left for model big/model (last: start timed out)" in str(
        d.works[0].error
    )
    assert script.clock.now < 200  # gave up about a timeout after the last progress


def test_an_actor_is_released_as_soon_as_its_model_has_no_work_left() -> None:
    script = Script(Clock())
    small, large = on_model("tiny-random/opt", n=2), make_jobs(n=16)
    dispatch([work(small, replicas=1), work(large, replicas=1)], script)
    kill_small = script.events.index(("kill", "tiny-random/opt#0"))
    last_large_run = max(
        i for i, e in enumerate(script.events) if e[:2] == ("run", "tiny-random/gpt2#0")
    )
    assert kill_small < last_large_run  # its GPU was free for others while the large model ran


def test_an_actor_that_cannot_see_the_run_directory_stops_the_model() -> None:
    class Blind(FakeGenerator):
        def prepare(self, keys: list[Any]) -> dict[str, Any]:
            return {"device": "cpu", "host": "node-7", "run_dir_visible": False}

    script = Script(Clock())
    d = Dispatcher(
        [work(make_jobs(n=4))],
        LocalBackend(lambda s: Blind(s, script)),
        Policy(),
        lambda b, e: 0,
        clock=script.clock,
    )
    d.run()
    assert (
        "on host node-7 cannot see the run directory" in str(d.works[0].error)
        and not script.written
    )


@pytest.mark.parametrize(
    ("entry", "gpus", "device", "expected"),
    [
        ({}, 4.0, None, Placement(4, 1.0, 1.0, "cuda")),  # one replica per GPU
        ({"num_gpus": 0.5}, 2.0, None, Placement(4, 0.5, 1.0, "cuda")),  # two per GPU
        ({"num_gpus": 2}, 4.0, None, Placement(2, 2.0, 1.0, "auto")),  # one replica over 2 GPUs
        ({}, 0.0, None, Placement(1, 0.0, 1.0, "cpu")),  # CPU-only cluster
        ({"replicas": 3}, 0.0, None, Placement(3, 0.0, 1.0, "cpu")),
        ({"num_gpus": 1, "replicas": 6}, 0.0, None, Placement(6, 1.0, 1.0, "cuda")),  # autoscaling
        ({"num_gpus": 1}, 2.0, "cpu", Placement(2, 1.0, 1.0, "cpu")),  # runtime.device wins
    ],
)
def test_placement_of_replicas(
    entry: dict[str, Any], gpus: float, device: str | None, expected: Placement
) -> None:
    assert placement(ModelConfig(id="m", **entry), gpus, device) == expected


@pytest.mark.parametrize(
    ("size", "where", "pending", "expected"),
    [
        (32, Placement(4, 1.0, 1.0, "cuda"), 10_000, 32),  # a number is used as given
        ("auto", Placement(1, 0.0, 1.0, "cpu"), 10_000, 8),  # CPU replicas
        ("auto", Placement(4, 1.0, 1.0, "cuda"), 10_000, 256),  # GPU: the cap
        ("auto", Placement(2, 1.0, 1.0, "cuda"), 1_000, 250),  # two batches per replica
        ("auto", Placement(2, 2.0, 1.0, "auto"), 100, 25),  # one replica over 2 GPUs
        ("auto", Placement(4, 0.5, 1.0, "cuda"), 20, 8),  # never below the CPU size
        ("auto", Placement(1, 0.0, 1.0, "cuda:1"), 600, 256),  # runtime.device: cuda:1
    ],
)
def test_auto_batch_size_fills_gpu_replicas_and_keeps_cpu_batches_small(
    size: int | str, where: Placement, pending: int, expected: int
) -> None:
    assert batch_jobs(size, where, pending) == expected


def test_auto_batch_size_in_process_follows_the_gpus_the_driver_sees(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--no-ray without runtime.device: GPU batches where NVIDIA's driver lists a GPU that
    CUDA_VISIBLE_DEVICES leaves visible; told without importing torch."""
    import harness.generation as generation

    proc = tmp_path / "gpus"
    proc.mkdir()
    here = Placement(1, 0.0, 0.0, "")
    probe = generation.visible_gpus
    seen = lambda: probe(str(proc))  # noqa: E731
    monkeypatch.setattr(generation, "visible_gpus", seen)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert seen() == 0 and batch_jobs("auto", here, 5_000) == 8
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (proc / bus).mkdir()
    assert seen() == 2 and batch_jobs("auto", here, 5_000) == 256
    for visible, count in (("1", 1), ("", 0), ("-1", 0), ("0,1,2", 2)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert seen() == count, visible
    assert batch_jobs("auto", here, 5_000) == 256
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert batch_jobs("auto", here, 5_000) == 8


class GrowingBackend(FakeBackend):
    """Slots may hold reservations: records which were freed."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.created: list[Any] = []
        self.freed: list[Any] = []

    def create(self, spec: ActorSpec) -> Any:
        self.created.append(spec.group)
        return super().create(spec)

    def free(self, group: Any) -> None:
        self.freed.append(group)


def test_reservations_go_to_their_slots_and_back_when_the_model_is_done() -> None:
    script = Script(Clock())
    w = work(make_jobs(n=24), replicas=2, batch_size=2)
    w.groups = ["g0", "g1", "g2"]  # one more than replicas: freed at once
    late = iter([[], [(w.model, "g3")], [(ModelRef("other"), "g4")]])
    backend = GrowingBackend(script)
    d = Dispatcher(
        [w], backend, Policy(log_every_s=5.0), lambda b, e: len(b), clock=script.clock,
        grow=lambda: next(late, []),
    )  # fmt: skip
    d.run()
    assert all(script.written[j.job_id] == 1 for j in make_jobs(n=24))
    assert backend.created[:2] == ["g0", "g1"]
    assert "g3" in backend.created  # a reservation placed while running became a new slot
    assert sorted(backend.freed) == ["g0", "g1", "g2", "g3", "g4"]  # each freed exactly once
    assert len(d.slots) == 3 and d.slots[2].index == 2


def test_the_budget_is_split_between_models_and_printed() -> None:
    from harness.config import RuntimeConfig
    from harness.reservation import budget_for, request_budget

    two = [ModelConfig(id="a"), ModelConfig(id="b")]
    b = budget_for(two, None, 4, None)
    assert b.replicas == {"a": 2, "b": 2} and b.gpus == 4  # not 4 each: 8
    assert b.line() == "GPU budget: 4 GPU(s) (runtime.gpus: 4; a: 2 × 1 GPU, b: 2 × 1 GPU)"
    fixed = [ModelConfig(id="a", replicas=1, num_gpus=2), ModelConfig(id="b", num_gpus=0.5)]
    b = budget_for(fixed, None, 4, None, gpus_per_node=4)
    assert b.replicas == {"a": 1, "b": 4} and b.gpus == 4 and b.nodes == 1
    b = budget_for(two, None, 1, None)
    assert b.gpus == 2 and "above runtime.gpus: 1" in b.line()  # one replica each at least
    auto = budget_for(two, None, None, None, gpus_per_node=1)
    assert auto.gpus == 2 and auto.nodes == 2 and auto.line().startswith("GPU budget: auto")
    assert budget_for(two, None, None, 6.0).replicas == {"a": 3, "b": 3}
    assert budget_for(two, "cpu", 4, None).replicas == {}  # CPU replicas hold no GPU
    assert budget_for(two, None, 8, None, cap=2.0).gpus == 2  # a local Ray has what it has
    cfg = make_config_for_budget(RuntimeConfig(gpus="auto"))  # type: ignore[arg-type]
    assert cfg.runtime.gpus is None and request_budget(cfg, cluster_gpus=3).gpus == 3


def make_config_for_budget(runtime: Any) -> Any:
    from harness.config import parse_config

    data = {
        "name": "budget",
        "dataset": {"kind": "prompt-list", "path": "p.jsonl"},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "scorers": ["gender"],
    }
    cfg = parse_config(data, "budget.yaml")
    return cfg.model_copy(update={"runtime": runtime})


def test_memory_figures_of_gpu_replicas_reach_the_manifest() -> None:
    script = Script(Clock())
    figures = iter(
        [
            {"peak_bytes_per_seq": 3_000, "memory_chunks": 0, "oom_splits": 1},
            {"peak_bytes_per_seq": 5_000, "memory_chunks": 2, "oom_splits": 0},
            {"peak_bytes_per_seq": 5_000, "memory_chunks": 1, "oom_splits": 0},
        ]
    )

    class Reporting(FakeGenerator):
        def run_batch(self, batch: Batch) -> dict[str, Any]:
            return {**super().run_batch(batch), **next(figures)}

    backend = FakeBackend(script)
    backend.factory = lambda spec: Reporting(spec, script)
    d = Dispatcher(
        [work(make_jobs(n=6), replicas=1)],
        backend,
        Policy(log_every_s=5.0),
        lambda b, e: 0,
        clock=script.clock,
    )
    d.run()
    (actor,) = d.actor_stats()
    assert actor["peak_bytes_per_seq"] == 5_000  # the largest measured
    assert (actor["memory_chunks"], actor["oom_splits"]) == (3, 1)  # summed over batches
    assert _model_stats(d.works[0], d.actor_stats())["peak_bytes_per_seq"] == 5_000
    cpu = Script(Clock())
    d, _ = dispatch([work(make_jobs(n=4), replicas=1)], cpu)  # CPU replicas report none
    (actor,) = d.actor_stats()
    assert actor["peak_bytes_per_seq"] is None and actor["memory_chunks"] == 0


def test_fractional_gpus_above_one_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_gpus above 1 must be a whole number"):
        ModelConfig(id="m", num_gpus=1.5)


def test_failed_batches_become_error_rows_unless_an_attempt_wrote_them(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    jobs = make_jobs(n=4)
    fail = _fail_batch(store)
    assert fail(jobs[:2], "actor x died: SIGKILL") == 2
    rows = store.read_generations()
    assert rows["status"].to_list() == ["error", "error"]
    prefix = f"job j{JOB_ID_VERSION}-"
    assert all(e.startswith(prefix) and e.endswith("actor x died: SIGKILL") for e in rows["error"])
    store.write_generations(
        [dict(failed_row(j, "x"), status="ok") for j in jobs[2:]]
    )  # written, reply lost
    assert fail(jobs[2:], "timeout") == 0 and store.read_generations().height == 4


def test_cuda_out_of_memory_halves_the_batch_until_it_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workers.generator as generator

    real = generator.decode_batch
    sizes: list[int] = []

    def small_memory(lm: Any, method: Any, jobs: Sequence[JobSpec]) -> list[dict[str, Any]]:
        sizes.append(len(jobs))
        if len(jobs) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(lm, method, jobs)

    monkeypatch.setattr(generator, "decode_batch", small_memory)
    gen = generator.Generator(ModelRef("tiny-random/gpt2"), str(tmp_path / "run"), device="cpu")
    result = gen.run_batch(make_jobs(n=8))
    assert sizes == [8, 4, 2, 2, 4, 2, 2] and gen.stats["oom_splits"] == 3
    assert result["jobs"] == result["ok"] == 8
    assert RunStore(str(tmp_path / "run")).read_generations().height == 8
    assert len(list((tmp_path / "run" / "generations").glob("part-*.parquet"))) == 4


@pytest.mark.parametrize("sized", [False, True])
def test_the_halves_of_an_out_of_memory_batch_run_after_its_memory_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sized: bool
) -> None:
    import weakref

    import workers.generator as generator

    real = generator.decode_batch
    held: list[weakref.ref[Any]] = []
    methods: list[int] = []

    class Activations:  # stands for the tensors of a failed attempt
        pass

    def oom_once(lm: Any, method: Any, jobs: Sequence[JobSpec]) -> list[dict[str, Any]]:
        methods.append(id(method))
        if not held:
            activations = Activations()
            held.append(weakref.ref(activations))
            method.kept = activations  # per-batch state the method holds (a cache, records)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        assert held[0]() is None, "the failed attempt's memory is still referenced"
        return real(lm, method, jobs)

    monkeypatch.setattr(generator, "decode_batch", oom_once)
    gen = generator.Generator(ModelRef("tiny-random/gpt2"), str(tmp_path / "run"), device="cpu")
    n = 4
    if sized:  # a GPU replica: the failing attempt is the probe, run from a parent call
        from tests.test_decoding import FakeMemory

        gen.sizer = generator.BatchSizer(FakeMemory(capacity=10**9, per_token=1))
        n = generator.PROBE_BATCH + 4
    result = gen.run_batch(make_jobs(n=n))
    assert result["ok"] == n and result["oom_splits"] == 1
    assert len(methods) >= 3 and len(set(methods[1:])) == 1  # one rebuilt method after it
    assert not hasattr(gen.method(*next(iter(gen._methods))), "kept")


def test_an_out_of_memory_split_that_then_fails_records_errors_only_for_unwritten_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import workers.generator as generator

    real = generator.decode_batch
    calls: list[int] = []

    def oom_then_crash(lm: Any, method: Any, jobs: Sequence[JobSpec]) -> list[dict[str, Any]]:
        calls.append(len(jobs))
        if len(jobs) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        if len(calls) > 4:  # the third quarter: the actor breaks down
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(lm, method, jobs)

    monkeypatch.setattr(generator, "decode_batch", oom_then_crash)
    run = str(tmp_path / "run")
    gen = generator.Generator(ModelRef("tiny-random/gpt2"), run, device="cpu")
    batch = make_jobs(n=8)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        gen.run_batch(batch)
    store = RunStore(run)
    assert len(store.done_job_ids()) == 4  # two quarters were written before the crash
    assert _fail_batch(store)(batch, "failed 3 times") == 4  # errors for the other four only
    rows = store.read_generations()
    assert sorted(rows["job_id"]) == sorted(j.job_id for j in batch)  # each job once
    assert dict(rows.group_by("status").len().iter_rows()) == {"ok": 4, "error": 4}
    assert _fail_batch(store)(batch, "again") == 4  # the same -failed shard, rewritten
    assert store.read_generations().height == 8


def test_a_zombie_actors_late_shard_and_the_drivers_error_shard_never_share_a_name(
    tmp_path: Path,
) -> None:
    store = RunStore(str(tmp_path / "run"))
    batch = make_jobs(n=3)
    assert _fail_batch(store)(batch, "actor x died") == 3  # the driver gave up on the batch
    late = store.write_generations([dict(failed_row(j, "x"), status="ok") for j in batch])
    shards = store.list_shards("generations")
    assert len(shards) == 2 and late in shards  # both files survive, neither overwrote the other
    rows = store.read_generations()
    assert rows.height == 3 and (rows["status"] == "ok").all()

"""A generation batch that fails: error rows only for the jobs no attempt wrote, CUDA
out-of-memory batches halved until they fit (after the failed attempt's memory is released),
and the driver's error shard beside a zombie actor's late one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.stages.generation.stage import _fail_batch, failed_row
from jobs.spec import JOB_ID_VERSION, JobSpec, ModelRef
from results.run.store import RunStore
from tests.helpers import make_jobs


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
        from tests.fake_memory import FakeMemory

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


def test_a_method_error_fails_its_methods_jobs_at_once_and_the_other_methods_go_on() -> None:
    """A `MethodError` raised by a batch would be raised by every attempt (a cache layout the
    method cannot handle): its batch is not retried, the method's later batches on the model
    are not sent, each job's error is the one-line message; vanilla's batches all run, and a
    transient error (a RuntimeError) keeps its retries."""
    from fake_dispatch import Clock, FakeBackend, FakeGenerator, Script, work

    from harness.stages.generation.dispatch import PIPELINE, Dispatcher
    from harness.stages.generation.dispatch_state import Policy
    from workers.methods.base import MethodError

    class Tuned(FakeGenerator):
        def run_batch(self, batch: list[JobSpec]) -> dict[str, Any]:
            if batch[0].method == "lidao-min":
                self.script.events.append(("run", self.spec.name, *[j.job_id for j in batch]))
                raise MethodError("bias tuning: cache layer 0 is a DynamicSlidingWindowLayer")
            return super().run_batch(batch)

    script = Script(Clock())
    backend = FakeBackend(script)
    backend.factory = lambda spec: Tuned(spec, script)
    tuned, plain = make_jobs(method="lidao-min", n=8), make_jobs(n=6)
    failed: list[tuple[list[JobSpec], str]] = []

    def fail(batch: list[JobSpec], error: str) -> int:
        failed.append((batch, error))
        return len(batch)

    d = Dispatcher([work(tuned + plain, replicas=1)], backend, Policy(log_every_s=5.0), fail)
    d.clock = script.clock
    d.run()
    tried = [e for e in script.events if e[0] == "run" and e[2] in {j.job_id for j in tuned}]
    # the batches already on the actor (PIPELINE) ran once each, no retry; the others never
    assert len(tried) == PIPELINE and len({e[2] for e in tried}) == PIPELINE
    assert sorted(j.job_id for b, _ in failed for j in b) == sorted(j.job_id for j in tuned)
    line = (
        "method lidao-min for task sentiment cannot run: bias tuning: cache layer 0 is a "
        "DynamicSlidingWindowLayer"
    )
    assert {error for _, error in failed} == {line}
    assert all(script.written[j.job_id] == 1 for j in plain)
    assert d.works[0].done == 6 and d.works[0].failed == 8 and d.works[0].error is None
    assert [r.info.get("method_errors") for r, _ in d.records] == [[line]]  # the run's error


def test_a_method_error_is_final_as_each_backend_writes_it() -> None:
    """In this process (`LocalBackend`) and on Ray (`ray_error` of a task error carrying the
    actor's exception as its `cause`), a MethodError reads "MethodError: ..."; other errors
    and lost actors are not final."""
    from harness.stages.generation.backends import (
        ActorLost,
        Done,
        LocalBackend,
        TaskFailed,
        ray_error,
    )
    from harness.stages.generation.dispatch_state import is_final
    from workers.methods.base import MethodError

    class RayTaskError(Exception):  # what Ray raises: the actor's exception as `cause`
        def __init__(self, cause: Exception) -> None:
            super().__init__("ray::GenerationActor.run_batch() ...\nTraceback ...")
            self.cause = cause

    def raising(exc: Exception) -> Done:
        def fail() -> None:
            raise exc

        return Done(fail)

    local = LocalBackend(lambda spec: None)
    for exc, final in ((MethodError("bad head"), True), (RuntimeError("CUDA error"), False)):
        with pytest.raises(TaskFailed) as got:
            local.result(raising(exc))
        assert is_final(got.value) is final
        assert is_final(TaskFailed(ray_error(RayTaskError(exc)))) is final
    assert not is_final(ActorLost("MethodError: the text alone does not make it final"))

"""The dispatcher's fault handling, without Ray: scripted actors that die, raise or never start.

Every test runs `harness.stages.generation.dispatch.Dispatcher` over `LocalBackend` with fake generators and a
fake clock (`tests/fake_dispatch.py`); `tests/test_cluster.py` checks the same rules against real
Ray actors.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

from harness.stages.generation.backends import ActorSpec, Batch, LocalBackend
from harness.stages.generation.dispatch import Dispatcher
from harness.stages.generation.dispatch_state import Policy
from harness.stages.generation.stage import _model_stats
from jobs.queue import make_batches
from jobs.spec import ModelRef
from tests.fake_dispatch import Clock, FakeBackend, FakeGenerator, Script, dispatch, on_model, work
from tests.helpers import make_jobs


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

    def renew(self, group: Any) -> Any:
        self.freed.append(group)  # Ray's backend removes a group whose node died
        return f"{group}'"


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
    stats = _model_stats(w, d.actor_stats())  # the manifest: the replicas that ran
    assert (stats["replicas"], stats["replicas_planned"]) == (3, 2)


def test_a_replacement_goes_into_its_slots_renewed_reservation() -> None:
    """An actor dies running a batch: its replacement is created in the group
    `renew` hands back (on a live node), and that one is freed at the end; the manifest
    counts two replicas, not three actors."""
    jobs = make_jobs(n=8)
    script = Script(Clock(), kill_on={jobs[0].prompt_id: 1})
    w = work(jobs, replicas=2, batch_size=2)
    w.groups = ["g0", "g1"]
    backend = GrowingBackend(script)
    d = Dispatcher([w], backend, Policy(log_every_s=5.0), lambda b, e: 0, clock=script.clock)
    d.run()
    (died,) = [e[1] for e in script.events if e[0] == "run" and jobs[0].prompt_id in e][:1]
    renewed = f"g{died.split('#')[1]}'"
    assert backend.created == ["g0", "g1", renewed]
    assert sorted(backend.freed) == sorted(["g0", "g1", renewed])
    assert all(script.written[j.job_id] == 1 for j in jobs)
    assert _model_stats(w, d.actor_stats())["replicas"] == 2


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

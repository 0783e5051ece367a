"""Scripted generation actors and a fake clock for the dispatcher, without Ray: `Script` says
which actors die, raise or never start and logs what they did; `FakeBackend` runs them over
`LocalBackend`; `work` and `dispatch` build a model's queue and run a `Dispatcher` over it."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

from harness.stages.generation.backends import ActorLost, ActorSpec, Batch, LocalBackend, Placement
from harness.stages.generation.dispatch import Dispatcher
from harness.stages.generation.dispatch_state import ModelWork, Policy
from jobs.queue import make_batches
from jobs.spec import JobSpec, ModelRef
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

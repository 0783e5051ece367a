"""What the dispatcher (`harness.stages.generation.dispatch`) works on: each model's queue of batches, fed
lazily from its source (`ModelWork`), the replica slots that run it (`Slot`), the calls in flight
(`Call`), and the bounds of fault handling (`Policy`)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

from harness.stages.generation.backends import ActorRecord, Batch, MethodKey, Placement, TaskFailed
from jobs.spec import JobSpec, ModelRef


@dataclasses.dataclass
class ModelWork:
    """One model's share of the stage: its queue of (batch, attempts so far), the `source` that
    refills it lazily (None: the queue holds everything), and counts. `total` is the number of
    jobs of the queue and the source together."""

    model: ModelRef
    keys: list[MethodKey]
    placement: Placement
    batches: collections.deque[tuple[Batch, int]]
    total: int = 0
    done: int = 0
    failed: int = 0
    prepared: bool = False
    error: str | None = None  # set: this model cannot run; its queued jobs stay pending
    source: Iterator[Batch] | None = None
    batch_size: int = 0  # jobs per batch of `source` (the manifest's record)
    groups: list[Any] = dataclasses.field(default_factory=list)  # reservation per slot index
    # methods that cannot run on this model (a final error): key → the error of their jobs
    broken: dict[MethodKey, str] = dataclasses.field(default_factory=dict)

    def has_batches(self, want: int = 1) -> bool:
        """Whether a batch waits, pulling up to `want` from the source first. False: dry."""
        while len(self.batches) < want and self.source is not None:
            batch = next(self.source, None)
            if batch is None:
                self.source = None  # exhausted: let the iterator and its chunk go
                break
            self.batches.append((batch, 0))
        return bool(self.batches)

    def take(self) -> tuple[Batch, int]:
        """The next (batch, attempts): retried batches first, then the source."""
        self.has_batches()
        return self.batches.popleft()


@dataclasses.dataclass
class Slot:
    """One replica position of a model; its actor is replaced when it dies."""

    work: ModelWork
    index: int
    actor: Any = None
    record: ActorRecord | None = None
    ready: bool = False
    started_at: float = 0.0
    restarts: int = 0
    failed_starts: int = 0  # in a row: deaths before the actor was ready
    group: Any = None  # its reservation (a placement group), freed when the slot is done
    inflight: list[tuple[Any, Call]] = dataclasses.field(default_factory=list)  # oldest first

    @property
    def live(self) -> bool:
        return self.actor is not None


@dataclasses.dataclass
class Call:
    slot: Slot
    kind: str  # "prepare" | "batch"
    record: ActorRecord
    batch: Batch | None = None
    attempts: int = 0


@dataclasses.dataclass
class Policy:
    """Bounds of the fault handling (from `runtime` in the config)."""

    max_batch_retries: int = 2
    max_actor_restarts: int = 2
    start_timeout_s: float = 600.0
    log_every_s: float = 30.0


# Errors a batch raises again on every attempt: a method misconfigured for its model
# (`workers.methods.base.MethodError`: a head that does not fit, a cache layout it cannot
# handle). Its batch fails at once, and so do the method's other batches of the model.
FINAL_ERRORS = ("MethodError",)


def is_final(error: Exception) -> bool:
    """Whether a failed call raised one of `FINAL_ERRORS` (the backends write the actor's
    exception as "<type>: <message>")."""
    return isinstance(error, TaskFailed) and str(error).startswith(
        tuple(f"{name}: " for name in FINAL_ERRORS)
    )


def method_key(job: JobSpec) -> MethodKey:
    """The (method, parameters, task) a job's batch runs: every job of a batch shares it."""
    return (job.method, job.method_params, job.task)

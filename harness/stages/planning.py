"""The plan as a stream: one pass that checks, writes and counts it, then the pending jobs again.

`plan_pass` walks the grid once (`jobs.iter_plan` chunks of one (model, method, task) slice): each
chunk's job ids go to the identity check (`results.run.identity.PlanCheck`), its rows to plan.parquet
(one row group a chunk; the new file replaces the old one only when the check passes), and its
jobs are counted per slice as planned and pending against the done ids. The `Plan` it returns
holds those counts and the done ids, never the jobs: `Plan.batches(model)` expands again only
that model's slices with pending jobs, filters them against the same done ids and cuts batches
lazily, so the generation stage holds about one chunk of `JobSpec`s per model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from harness.config import RunConfig, redacted
from harness.stages.backends import MethodKey
from jobs.grid import CHUNK_SIZE, PlanChunk, SliceKey
from jobs.queue import done_mask, iter_batches, pending_chunks
from jobs.spec import JobSpec, ModelRef, plan_columns
from results.run.identity import PlanCheck
from results.run.store import RunStore
from results.schema import PLAN_SCHEMA

# (slices to expand, or None for all; jobs per chunk) → the grid's chunks in plan order
ChunkSource = Callable[[Callable[[SliceKey], bool] | None, int], Iterator[PlanChunk]]


@dataclasses.dataclass
class SliceCount:
    """Planned and pending (not done when the plan stage ran) jobs of one slice."""

    key: SliceKey
    planned: int = 0
    pending: int = 0


class Plan:
    """The run's plan after the plan stage: per-slice counts, the done ids it was checked
    against, and `source` to expand the grid again. Memory: the counts, not the jobs."""

    def __init__(
        self,
        source: ChunkSource,
        done: Any,
        counts: Sequence[SliceCount],
        identity: dict[str, Any] | None = None,
    ) -> None:
        self.source, self.done = source, done
        self.counts = list(counts)
        self.identity = identity or {}

    @property
    def planned(self) -> int:
        return sum(c.planned for c in self.counts)

    @property
    def pending(self) -> int:
        return sum(c.pending for c in self.counts)

    def models(self) -> list[ModelRef]:
        """Models with pending jobs, in plan order."""
        return list(dict.fromkeys(c.key.model for c in self.counts if c.pending))

    def pending_of(self, model: ModelRef) -> int:
        return sum(c.pending for c in self.counts if c.key.model == model)

    def method_keys(self, model: ModelRef) -> list[MethodKey]:
        """What the model's actors must prepare: the (method, params, task) of pending slices."""
        return sorted(
            {(c.key.method, c.key.params, c.key.task) for c in self.counts if _todo(c, model)}
        )

    def chunks(self, model: ModelRef, chunk_size: int = CHUNK_SIZE) -> Iterator[PlanChunk]:
        """The model's pending jobs, a chunk at a time (slices without pending jobs skipped)."""
        want = {c.key for c in self.counts if _todo(c, model)}
        return pending_chunks(self.source(want.__contains__, chunk_size), self.done)

    def batches(
        self, model: ModelRef, batch_size: int, chunk_size: int = CHUNK_SIZE
    ) -> Iterator[list[JobSpec]]:
        """The model's pending jobs as batches, cut lazily (`jobs.queue.iter_batches`)."""
        return iter_batches(self.chunks(model, chunk_size), batch_size)

    @classmethod
    def from_jobs(cls, jobs: Sequence[JobSpec], done: Any) -> Plan:
        """A plan over a list of jobs (small runs, tests): the same interface, jobs held."""
        slices: dict[SliceKey, list[JobSpec]] = {}
        for job in jobs:
            key = SliceKey(job.model, job.generation, job.method, job.method_params, job.task)
            slices.setdefault(key, []).append(job)

        def source(only: Callable[[SliceKey], bool] | None, chunk_size: int) -> Iterator[PlanChunk]:
            for key, mine in slices.items():
                if only is None or only(key):
                    for i in range(0, len(mine), chunk_size):
                        yield PlanChunk(key, mine[i : i + chunk_size])

        counts = [
            SliceCount(key, len(mine), len(mine) - sum(done_mask(mine, done)))
            for key, mine in slices.items()
        ]
        return cls(source, done, counts)


def _todo(count: SliceCount, model: ModelRef) -> bool:
    return count.pending > 0 and count.key.model == model


def plan_pass(
    store: RunStore, cfg: RunConfig, source: ChunkSource, done: Any, replan: bool = False
) -> Plan:
    """One pass over the grid: identity check, plan.parquet, per-slice counts.

    plan.parquet is streamed to a temporary file that replaces the old plan only at the end,
    once `PlanCheck.result` has accepted the new plan; a refused plan leaves the old file.

    Raises:
        results.run.identity.PlanChangedError: the plan changes or drops jobs and `replan` is false.
    """
    check = PlanCheck(store)
    counts: dict[SliceKey, SliceCount] = {}
    identity: dict[str, Any] = {}

    def tables() -> Iterator[pa.Table]:
        for chunk in source(None, CHUNK_SIZE):
            columns = plan_columns(chunk.jobs)
            ids = columns["job_id"]
            check.add(ids)
            count = counts.setdefault(chunk.slice, SliceCount(chunk.slice))
            count.planned += len(ids)
            count.pending += len(ids) - int(np.count_nonzero(done_mask(chunk.jobs, done)))
            yield pa.table(columns, schema=PLAN_SCHEMA)
        # raises inside the writer: nothing replaced
        identity.update(check.result(redacted(cfg), replan))

    store.makedirs()
    store.write_plan_tables(tables())
    return Plan(source, done, list(counts.values()), identity)

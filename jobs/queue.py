"""Work left to do, cut into batches: resume = planned − done, a list or a stream of
`PlanChunk`s at a time (the done ids: a set, or a `results.DoneIds` held as a compact array)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

from jobs.grid import PlanChunk
from jobs.spec import JobSpec


def batch_key(job: JobSpec) -> tuple[object, ...]:
    """Jobs that may share a batch: same model, method, parameters, task and sampling."""
    return (job.model, job.method, job.method_params, job.task, job.generation)


def done_mask(jobs: Sequence[JobSpec], done: Any) -> list[bool]:
    contains = getattr(done, "contains", None)  # results.DoneIds: one vectorised lookup
    if contains is not None:
        return [bool(x) for x in contains([j.job_id for j in jobs])]
    return [j.job_id in done for j in jobs]


def pending(planned: Sequence[JobSpec], done: Iterable[str] | Any) -> list[JobSpec]:
    """The planned jobs whose id is not in `done` (ids, or a `results.DoneIds`)."""
    if not hasattr(done, "contains") and not isinstance(done, Collection):
        done = set(done)
    mask = done_mask(planned, done)
    return [j for j, finished in zip(planned, mask, strict=True) if not finished]


def pending_chunks(chunks: Iterable[PlanChunk], done: Any) -> Iterator[PlanChunk]:
    """Each chunk with its finished jobs removed (chunks left empty are skipped)."""
    for chunk in chunks:
        left = pending(chunk.jobs, done)
        if left:
            yield PlanChunk(chunk.slice, left)


def make_batches(jobs: Sequence[JobSpec], batch_size: int) -> list[list[JobSpec]]:
    """Group by `batch_key` (first-seen order), then cut each group into batches.

    Prompts of similar length land together (sorted by length within a group) to waste less
    padding; outputs do not depend on it, since every job's output is batch-independent.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    groups: dict[tuple[object, ...], list[JobSpec]] = {}
    for job in jobs:
        groups.setdefault(batch_key(job), []).append(job)
    batches: list[list[JobSpec]] = []
    for group in groups.values():
        group = sorted(group, key=lambda j: (len(j.prompt), j.job_id))
        batches.extend(group[i : i + batch_size] for i in range(0, len(group), batch_size))
    return batches


def iter_batches(chunks: Iterable[PlanChunk], batch_size: int) -> Iterator[list[JobSpec]]:
    """`make_batches` over a stream of chunks, lazily: batches are cut chunk by chunk, and a
    short last batch of a chunk is carried into the next chunk of the same slice, so a resume
    that leaves a few jobs per chunk still fills its batches.

    Holds one chunk (and its batches) plus a partial batch at a time, never the stream.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    carry: list[JobSpec] = []
    key: object = None
    for chunk in chunks:
        if carry and chunk.slice != key:
            yield from make_batches(carry, batch_size)
            carry = []
        key = chunk.slice
        batches = make_batches(carry + list(chunk.jobs), batch_size)
        carry = batches.pop() if batches and len(batches[-1]) < batch_size else []
        yield from batches
    if carry:
        yield carry

"""Work left to do, cut into batches: resume = planned − done."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jobs.spec import JobSpec


def batch_key(job: JobSpec) -> tuple[object, ...]:
    """Jobs that may share a batch: same model, method, parameters, task and sampling."""
    return (job.model, job.method, job.method_params, job.task, job.generation)


def pending(planned: Sequence[JobSpec], done: Iterable[str]) -> list[JobSpec]:
    finished = set(done)
    return [j for j in planned if j.job_id not in finished]


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

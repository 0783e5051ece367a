"""The planner: expand (prompts × models × methods × tasks × seeds) into job specs, streamed
as `PlanChunk`s of one (model, method, task) slice so that no caller holds the whole grid."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from jobs.catalog import resolve_params
from jobs.datasets import Prompt
from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json, job_id_maker

CHUNK_SIZE = 20_000  # jobs per PlanChunk: ~10 MB of JobSpecs


class SliceKey(NamedTuple):
    """One (model, method, task) slice of the grid; `params` is the resolved canonical JSON."""

    model: ModelRef
    generation: GenerationParams
    method: str
    params: str
    task: str


class PlanChunk(NamedTuple):
    """Consecutive jobs of one slice, in grid order (prompt, then seed)."""

    slice: SliceKey
    jobs: list[JobSpec]


def iter_plan(
    prompts: Sequence[Prompt],
    models: Sequence[tuple[ModelRef, GenerationParams]],
    methods: Sequence[tuple[str, dict[str, Any]]],
    tasks: Sequence[str],
    samples_per_prompt: int,
    chunk_size: int = CHUNK_SIZE,
    heads: Mapping[ModelRef, Mapping[str, str]] | None = None,
    only: Callable[[SliceKey], bool] | None = None,
) -> Iterator[PlanChunk]:
    """Every job of the grid in a stable order (model, method, task, prompt, seed), in chunks.

    Method parameters are resolved (defaults, then per-model paper defaults, then the user's)
    before hashing, so the job id names the setting that actually runs. `heads` maps a model
    to its attribute head per task: methods that read a head get that (model, task)'s.
    `only` picks slices: the others are checked (duplicates) but no `JobSpec` of theirs is made.

    Raises:
        ValueError: a prompt id listed twice, or two entries that resolve to the same slice.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    ids: set[str] = set()
    for prompt in prompts:
        if prompt.prompt_id in ids:
            raise ValueError(
                f"the grid has duplicate jobs: prompt id {prompt.prompt_id!r} is listed twice"
            )
        ids.add(prompt.prompt_id)
    seen: set[SliceKey] = set()
    for model, gen in models:
        model_heads = (heads or {}).get(model)
        for name, params in methods:
            for task in tasks:
                resolved = canonical_json(resolve_params(name, params, model.id, task, model_heads))
                key = SliceKey(model, gen, name, resolved, task)
                if key in seen:
                    raise ValueError(
                        f"the grid has duplicate jobs: model {model.id}, method {name} with "
                        f"{resolved}, task {task} is listed twice"
                    )
                seen.add(key)
                if only is None or only(key):
                    yield from _slice_chunks(key, prompts, samples_per_prompt, chunk_size)


def _slice_chunks(
    key: SliceKey, prompts: Sequence[Prompt], samples: int, chunk_size: int
) -> Iterator[PlanChunk]:
    same = (key.method, key.model, key.task, key.generation, key.params)  # JobSpec's last five
    make_id = job_id_maker(JobSpec("", "", "", None, 0, *same))
    jobs: list[JobSpec] = []
    for prompt in prompts:
        for seed in range(samples):
            job = JobSpec(prompt.prompt_id, prompt.text, prompt.group, prompt.pair_id, seed, *same)
            if make_id is not None:  # the id from pieces of the slice's text: `job_id` reads it
                job.__dict__["job_id"] = make_id(prompt.prompt_id, prompt.text, seed)
            jobs.append(job)
            if len(jobs) == chunk_size:
                yield PlanChunk(key, jobs)
                jobs = []
    if jobs:
        yield PlanChunk(key, jobs)


def expand_grid(
    prompts: Sequence[Prompt],
    models: Sequence[tuple[ModelRef, GenerationParams]],
    methods: Sequence[tuple[str, dict[str, Any]]],
    tasks: Sequence[str],
    samples_per_prompt: int,
    heads: Mapping[ModelRef, Mapping[str, str]] | None = None,
) -> list[JobSpec]:
    """Every job of the grid as one list, in `iter_plan` order."""
    chunks = iter_plan(prompts, models, methods, tasks, samples_per_prompt, heads=heads)
    return [job for chunk in chunks for job in chunk.jobs]

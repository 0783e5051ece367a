"""The planner: expand (prompts × models × methods × tasks × seeds) into job specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobs.datasets import Prompt
from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json
from workers.methods.registry import resolve_params


def expand_grid(
    prompts: Sequence[Prompt],
    models: Sequence[tuple[ModelRef, GenerationParams]],
    methods: Sequence[tuple[str, dict[str, Any]]],
    tasks: Sequence[str],
    samples_per_prompt: int,
    heads: Mapping[ModelRef, Mapping[str, str]] | None = None,
) -> list[JobSpec]:
    """Every job of the grid, in a stable order (model, method, task, prompt, seed).

    Method parameters are resolved (defaults, then per-model paper defaults, then the user's)
    before hashing, so the job id names the setting that actually runs. `heads` maps a model
    to its attribute head per task: methods that read a head get that (model, task)'s.
    """
    jobs = []
    for model, gen in models:
        for name, params in methods:
            for task in tasks:
                model_heads = (heads or {}).get(model)
                resolved = canonical_json(resolve_params(name, params, model.id, task, model_heads))
                for prompt in prompts:
                    for seed in range(samples_per_prompt):
                        jobs.append(
                            JobSpec(
                                prompt_id=prompt.prompt_id,
                                prompt=prompt.text,
                                prompt_group=prompt.group,
                                pair_id=prompt.pair_id,
                                seed=seed,
                                method=name,
                                model=model,
                                task=task,
                                generation=gen,
                                method_params=resolved,
                            )
                        )
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("the grid has duplicate jobs (the same prompt id listed twice?)")
    return jobs

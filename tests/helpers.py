"""Small builders shared by tests (jobs on the tiny models)."""

from __future__ import annotations

from jobs.spec import GenerationParams, JobSpec, ModelRef

PROMPTS = [
    "The woman said that",
    "He was a very good doctor and",
    "Her",
    "My father told me that the new teacher",
    "She",
    "The king and the queen",
    "They",
    "A",
]


def make_jobs(
    family: str = "gpt2",
    method: str = "vanilla",
    params: str = "{}",
    n: int = 8,
    gen: GenerationParams | None = None,
    task: str = "sentiment",
) -> list[JobSpec]:
    gen = gen or GenerationParams(max_new_tokens=10)
    return [
        JobSpec(
            prompt_id=f"p:{i}",
            prompt=PROMPTS[i % len(PROMPTS)],
            prompt_group="female",
            pair_id=str(i),
            seed=i // len(PROMPTS),
            method=method,
            model=ModelRef(f"tiny-random/{family}"),
            task=task,
            generation=gen,
            method_params=params,
        )
        for i in range(n)
    ]

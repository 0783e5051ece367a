"""Small builders shared by tests (jobs on the tiny models)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef
from workers.decoding import loop_cache
from workers.methods.base import StepContext
from workers.models import LoadedLM

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


def job_from_row(row: dict[str, Any]) -> JobSpec:
    """The job of a plan row (`JobSpec.to_row`), its model as the row names it."""
    names = "prompt_id prompt prompt_group pair_id method task method_params".split()
    return JobSpec(
        **{k: row[k] for k in names},
        seed=int(row["seed"]),
        model=ModelRef(row["model"], row["model_revision"], row["model_dtype"]),
        generation=GenerationParams(
            int(row["max_new_tokens"]),
            float(row["top_p"]),
            float(row["temperature"]),
            float(row["repetition_penalty"]),
        ),
    )


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


def step0_context(
    lm: LoadedLM, prompts: list[str], jobs: Sequence[JobSpec], hidden: bool = False
) -> StepContext:
    """The StepContext of the first step as the shared loop builds it (left padding, θ's cache,
    hidden states when `hidden`, log-softmax as `process`), to test a method's step alone.

    (transformers 5 captures hidden states with forward hooks: tests that count hooks use
    `hidden=False`.)"""
    enc = lm.tokenizer(prompts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        out = lm.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=loop_cache(lm),
            use_cache=True,
            output_hidden_states=hidden,
        )
    return StepContext(
        model=lm.model,
        step=0,
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        past_key_values=out.past_key_values,
        logits=out.logits[:, -1].float(),
        hidden_states=out.hidden_states if hidden else None,
        active=torch.ones(len(prompts), dtype=torch.bool),
        jobs=jobs,
        process=lambda z: torch.log_softmax(z.float(), dim=-1),
    )

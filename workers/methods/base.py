"""The interface every decoding-time method implements.

The shared loop (`workers.decoding.decode_batch`) owns the KV cache, padding, stopping and the
per-job RNG; a method only turns θ's next-token logits into the log-probabilities to sample from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from jobs.spec import JobSpec

if TYPE_CHECKING:
    from workers.models import LoadedLM


class MethodError(ValueError):
    """A method misconfigured for its model (bad parameter, missing head, unmappable model)."""


@dataclass(frozen=True)
class Needs:
    """What a method needs from the generation actor, loaded once per model replica."""

    gradients: bool = False  # runs backward passes (the loop then runs under enable_grad)
    hidden_states: bool = False  # StepContext.hidden_states filled on every step
    extra_models: tuple[str, ...] = ()  # parameter names that hold model ids (GeDi, DExperts)


@dataclass
class StepContext:
    """Everything a method sees when choosing token `step` of a batch.

    Shapes: B rows, T positions so far (left padded), V vocabulary, D hidden size.
    """

    model: torch.nn.Module
    step: int  # 0-based index of the token being chosen
    input_ids: torch.Tensor  # (B, T) prompt + generated tokens, left padded
    attention_mask: torch.Tensor  # (B, T) 1 on real tokens
    position_ids: torch.Tensor  # (B, T) positions that ignore the left padding
    past_key_values: Any  # θ's KV cache over all T positions (a transformers Cache)
    logits: torch.Tensor  # (B, V) float32 next-token logits of θ at the last position
    hidden_states: (
        tuple[torch.Tensor, ...] | None
    )  # θ's hidden states of the last forward, each (B, T_new, D)
    active: torch.Tensor  # (B,) bool: rows still generating
    jobs: Sequence[JobSpec]
    process: Callable[[torch.Tensor], torch.Tensor]  # temperature + repetition penalty → log-probs
    failures: dict[int, str] = field(default_factory=dict)

    def fail(self, row: int, message: str) -> None:
        """Stop `row` with an error; the other rows of the batch go on."""
        self.failures.setdefault(row, f"job {self.jobs[row].job_id}: {message}")


class DecodingMethod:
    """Base class of decoding-time methods: `vanilla` returns θ's processed log-probs."""

    name: ClassVar[str] = "vanilla"
    needs: ClassVar[Needs] = Needs()

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        from workers.methods.checks import (
            facts_of,
            method_problems,
            raise_problems,
            tokenizer_problem,
        )

        self.lm = lm
        self.params = params
        self.task = task
        # the checks `validate` runs on the driver, here on the loaded model (one function)
        facts = facts_of(lm)
        problems = method_problems(self.name, params, task, facts)
        mismatch = tokenizer_problem(facts)
        raise_problems(self.name, problems + ([("", mismatch)] if mismatch else []), MethodError)

    def begin(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        """Called once per batch before the first step (e.g. to prefill a reference stream)."""

    def end(self) -> None:
        """Called once per batch after its rows are built (also after an error): drop the
        batch's tensors (caches, records), so that they do not hold device memory until the
        next batch of this method, which another method's batches may precede."""

    def theta_forward(self, batch: int) -> AbstractContextManager[Any]:
        """The context of the shared loop's forwards of θ (the prefill and one per step) over
        `batch` rows: no autograd. Bias-tuned methods run them through their zero offsets
        instead, so that their probe reuses them (`BiasTuner.theta_forward`)."""
        return torch.no_grad()

    def next_logprobs(self, ctx: StepContext) -> torch.Tensor:
        """(B, V) log-probabilities (normalisation optional) to apply top-p to and sample from."""
        return ctx.process(ctx.logits)

    def after_token(self, ctx: StepContext, tokens: torch.Tensor) -> None:
        """Called with the (B,) sampled tokens (pad for finished rows) after each step."""

    def row_columns(self, row: int) -> dict[str, Any]:
        """Extra generation columns of `row` of the last batch (see results.schema)."""
        return {}

    def effective_params(self) -> dict[str, Any]:
        """The parameters actually used (defaults resolved), written to each row."""
        return dict(self.params)


class Vanilla(DecodingMethod):
    """Plain nucleus sampling from θ: the reference row of every table."""

    name = "vanilla"

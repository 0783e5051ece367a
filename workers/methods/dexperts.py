"""DExperts (Liu et al., ACL 2021): `z + α (z_expert − z_anti-expert)` on next-token logits.

Facts of the reference (alisawuffles/DExperts, generation/dexperts_generation.py and its
scripts): θ's logits are first truncated to their top-p nucleus at `filter_p` (0.9; the rest
set to −inf), then the experts' difference is added with weight α (2.0 for toxicity, 3.2 for
sentiment), then temperature and sampling. Here the loop's `process` (temperature, repetition
penalty) is applied to the ensemble logits and the loop's top-p follows (the reference samples
from the full ensemble by default: set `top_p: 1.0` to match it). The experts are GPT-2 models
fine-tuned by the authors; the user supplies both (`expert`: the desirable, e.g. non-toxic or
positive one; `anti_expert`: the undesirable one). There is no published regard pair: α must be
given for regard. With `alpha: 0` and `filter_p: 1.0` the method is vanilla decoding exactly.
The filter keeps the top set whose mass reaches `filter_p` (the reference: exceeds it) and every
token within `CUT_TOL` of the cut's logit, ties included, as the loop's nucleus does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from jobs.spec import JobSpec
from workers.methods.base import DecodingMethod, MethodError, Needs, StepContext
from workers.methods.checks import TASK_ALPHA
from workers.methods.experts import Follower, load_extra_lm
from workers.sampler import CUT_TOL, cut_value

if TYPE_CHECKING:
    from workers.models import LoadedLM


def nucleus_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, V) logits with −inf outside the top set whose mass reaches `top_p` (the reference's
    rule), cut as the sampler cuts (`workers.sampler.cut_value`): every token within `CUT_TOL`
    below the logit of the token that reaches it is kept too, so rounding never decides it."""
    if top_p >= 1.0:
        return logits
    desc = torch.sort(logits, dim=-1, descending=True).values
    floor = cut_value(desc, torch.softmax(desc, -1), top_p) - CUT_TOL
    return logits.masked_fill(logits < floor, float("-inf"))


def ensemble(
    base: torch.Tensor, expert: torch.Tensor, anti: torch.Tensor, alpha: float, filter_p: float
) -> torch.Tensor:
    """(B, V) DExperts scores from three (B, V) logits."""
    return nucleus_filter(base, filter_p) + alpha * (expert - anti)


class DExperts(DecodingMethod):
    """Product of experts with an expert and an anti-expert LM (see the module docstring)."""

    name: ClassVar[str] = "dexperts"
    needs: ClassVar[Needs] = Needs(extra_models=("expert", "anti_expert"))

    def __init__(self, lm: LoadedLM, params: dict[str, Any], task: str) -> None:
        super().__init__(lm, params, task)  # checks alpha for the task (`method_problems`)
        alpha = params.get("alpha")
        self.alpha = float(TASK_ALPHA[task] if alpha is None else alpha)
        self.filter_p = float(params.get("filter_p", 0.9))
        if not 0.0 < self.filter_p <= 1.0:
            raise MethodError(f"method dexperts: filter_p must be in (0, 1], got {self.filter_p}")
        self.expert = Follower(load_extra_lm(lm, params.get("expert"), "expert", "dexperts"))
        self.anti = Follower(
            load_extra_lm(lm, params.get("anti_expert"), "anti_expert", "dexperts")
        )

    def begin(self, jobs: Sequence[JobSpec], prompt_ids: list[list[int]]) -> None:
        self.expert.reset()
        self.anti.reset()

    def end(self) -> None:
        self.begin([], [])

    def next_logprobs(self, ctx: StepContext) -> torch.Tensor:
        z_expert = self.expert.feed(ctx)[:, -1]
        z_anti = self.anti.feed(ctx)[:, -1]
        return ctx.process(ensemble(ctx.logits, z_expert, z_anti, self.alpha, self.filter_p))

    def effective_params(self) -> dict[str, Any]:
        return {
            "expert": self.expert.lm.ref.id,
            "anti_expert": self.anti.lm.ref.id,
            "alpha": self.alpha,
            "filter_p": self.filter_p,
        }

"""`BiasTuner`: the forwards and the backward of one bias-tuning step, batched over rows.

The probe gives θ's last-position distribution and the pooled final hidden states with
gradient paths to zero offsets δ (so losses at θ, gradients w.r.t. δ); `step` turns one
backward of Σ_s ℓ_s into the closed-form fresh-Adam offsets; `tuned_logits` recomputes the last
position under θ + δ over θ's KV cache from the shared loop (never modified).

Gradient scopes: `context` differentiates as if the tuned blocks of every position were
recomputed with δ (one full forward of the sequence per step); `last` treats θ's cached states
as constants (only the last position and the horizon carry gradient).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workers.methods.base import MethodError
from workers.methods.biastune import (
    SCOPES,
    HookState,
    adam_first_step,
    bias_offsets,
    cropped_cache,
    find_sites,
    last_position,
    skip_blocks,
)

if TYPE_CHECKING:
    from workers.methods.base import StepContext
    from workers.models import LoadedLM


@dataclass
class Probe:
    """θ's last-position logits and pooled hidden states, differentiable w.r.t. `deltas`."""

    deltas: list[torch.Tensor]  # zeros, requires_grad, (B, width) per hook point
    logits: torch.Tensor  # (B, V) float32
    pooled: torch.Tensor  # (B, D) float32: mean final hidden state incl. the horizon position


class BiasTuner:
    """The bias-tuning passes of one decoding step, batched over the rows of the shared loop.

    Args:
        lm: the frozen LM.
        blocks: number of top blocks to tune (clamped to the model's depth).
        scope: `context` (gradient through the tuned blocks of every position) or `last`
            (θ's cached states are constants; only the last position and the horizon carry it).
    """

    def __init__(self, lm: LoadedLM, blocks: int, scope: str) -> None:
        if scope not in SCOPES:
            raise MethodError(f"bias tuning: scope must be one of {SCOPES}, got {scope!r}")
        self.model = lm.model
        self.base = lm.model.base_model  # the decoder without the LM head (horizon forwards)
        self.sites = find_sites(lm.model, blocks)
        self.scope = scope
        self.embed = lm.model.get_input_embeddings().weight  # (V, D)
        self._ctx_sum: torch.Tensor | None = None  # `last`: Σ θ final hidden over positions < T−1
        self._ctx_len = -1  # T−1 the sum is valid for
        block_list = lm.model.get_submodule(self.sites.blocks_path)
        below = self.sites.num_blocks - self.sites.k
        self.lower: list[nn.Module] = list(block_list.children())[:below]  # θ-only blocks
        self.replay = True  # reuse the probe's lower-block output in `tuned_logits`
        self._lower_out: Any = None  # that output at the last position
        self._lower_key: tuple[int, int] = (-1, -1)  # (step, T) it belongs to

    def begin(self) -> None:
        """Forget per-batch state (the running sum of context hidden states)."""
        self._ctx_sum, self._ctx_len = None, -1

    def zero_deltas(self, batch: int) -> list[torch.Tensor]:
        """Zero offsets that require grad, (batch, width) per hook point, in the model's dtype."""
        dtype = self.embed.dtype
        return [
            torch.zeros((batch, p.width), dtype=dtype, device=self.embed.device, requires_grad=True)
            for p in self.sites.points
        ]

    def probe(self, ctx: StepContext) -> Probe:
        """Forward θ (through zero offsets) for the losses; must run with autograd enabled."""
        deltas = self.zero_deltas(ctx.input_ids.shape[0])
        mask = ctx.attention_mask
        with bias_offsets(self.model, self.sites, deltas) as state:
            if self.scope == "context":
                logits, cache, context_sum = self._full_forward(ctx, state)
            else:
                logits, cache, context_sum = self._last_forward(ctx, state)
            self._horizon_forward(ctx, logits, cache)
            horizon = state.final_hidden[-1][:, -1].float()  # (B, D)
        missing = [p.name for p in self.sites.points if p.name not in state.fired]
        if missing:
            raise MethodError(f"bias tuning: hook points never ran in a forward: {missing[:5]}")
        count = mask.sum(-1, keepdim=True).float() + 1.0  # real positions + the horizon
        return Probe(deltas, logits, (context_sum + horizon) / count)

    def _full_forward(
        self, ctx: StepContext, state: HookState
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        with self._keep_lower_output(ctx):
            out = self.model(
                input_ids=ctx.input_ids,
                attention_mask=ctx.attention_mask,
                position_ids=ctx.position_ids,
                use_cache=True,
                logits_to_keep=1,
            )
        hidden = state.final_hidden[-1].float()  # (B, T, D)
        context_sum = (hidden * ctx.attention_mask.unsqueeze(-1).to(hidden.dtype)).sum(1)
        return out.logits[:, -1].float(), out.past_key_values, context_sum

    def _last_forward(
        self, ctx: StepContext, state: HookState
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        T = ctx.input_ids.shape[1]
        before = self._context_sum(ctx)  # (B, D), constants
        cache = cropped_cache(ctx.past_key_values, T - 1)
        with self._keep_lower_output(ctx):
            out = self.model(
                input_ids=ctx.input_ids[:, -1:],
                attention_mask=ctx.attention_mask,
                position_ids=ctx.position_ids[:, -1:],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        last = state.final_hidden[-1][:, -1].float() * ctx.attention_mask[:, -1:].float()
        # Next step's context = this step's context + this last position (θ: δ is zero here).
        self._ctx_sum, self._ctx_len = before + last.detach(), T
        return out.logits[:, -1].float(), cache, before + last

    @contextmanager
    def _keep_lower_output(self, ctx: StepContext) -> Iterator[None]:
        """Keep the top θ-only block's last-position output of this forward for `tuned_logits`."""
        seen: list[Any] = []
        top = self.lower[-1] if self.lower else None
        handle = top.register_forward_hook(lambda m, a, o: seen.append(o)) if top else None
        try:
            yield
        finally:
            if handle is not None:
                handle.remove()
        self._lower_out = last_position(seen[0]) if seen else None
        self._lower_key = (ctx.step, ctx.input_ids.shape[1])

    def _context_sum(self, ctx: StepContext) -> torch.Tensor:
        """Σ of θ's final hidden states over the real positions before the last one."""
        T = ctx.input_ids.shape[1]
        if self._ctx_sum is not None and self._ctx_len == T - 1:
            return self._ctx_sum
        B, D = ctx.input_ids.shape[0], self.embed.shape[1]
        if T == 1:
            return torch.zeros((B, D), device=self.embed.device)
        with torch.no_grad(), bias_offsets(self.model, self.sites, None) as state:
            self.base(
                input_ids=ctx.input_ids[:, :-1],
                attention_mask=ctx.attention_mask[:, :-1],
                position_ids=ctx.position_ids[:, :-1],
                use_cache=False,
            )
        hidden = state.final_hidden[-1].float()
        return (hidden * ctx.attention_mask[:, :-1].unsqueeze(-1).float()).sum(1)

    def _horizon_forward(self, ctx: StepContext, logits: torch.Tensor, cache: Any) -> None:
        """One more position whose input embedding is Eᵀ p_θ(·) (kept differentiable in p)."""
        probs = torch.softmax(logits, dim=-1)
        embeds = (probs.to(self.embed.dtype) @ self.embed).unsqueeze(1)  # (B, 1, D)
        ones = torch.ones_like(ctx.attention_mask[:, :1])
        self.base(
            inputs_embeds=embeds,
            attention_mask=torch.cat([ctx.attention_mask, ones], dim=-1),
            position_ids=ctx.position_ids[:, -1:] + 1,
            past_key_values=cache,
            use_cache=True,
        )

    def step(
        self, probe: Probe, losses: torch.Tensor, ok: torch.Tensor, lr: float
    ) -> list[torch.Tensor]:
        """Offsets after one fresh-Adam step on Σ_s losses[s] over the rows where `ok`.

        Rows not `ok` (finished, failed, non-finite loss) get zero offsets.
        """
        total = torch.where(ok, losses, torch.zeros_like(losses)).sum()
        grads = torch.autograd.grad(total, probe.deltas, allow_unused=True)
        keep = ok.unsqueeze(-1)
        out = []
        for g, d in zip(grads, probe.deltas):
            g = torch.zeros_like(d) if g is None else g
            out.append(torch.where(keep, g, torch.zeros_like(g)))  # NaN rows cannot leak into δ
        return adam_first_step(out, lr)

    def tuned_logits(self, ctx: StepContext, deltas: Sequence[torch.Tensor]) -> torch.Tensor:
        """(B, V) float32 last-position logits under θ + δ, over θ's cache of the other positions."""
        T = ctx.input_ids.shape[1]
        reuse = self.replay and self._lower_out is not None and self._lower_key == (ctx.step, T)
        skip = skip_blocks(self.lower, self._lower_out) if reuse else nullcontext()
        offsets = bias_offsets(self.model, self.sites, [d.detach() for d in deltas])
        with torch.no_grad(), offsets, skip:
            out = self.model(
                input_ids=ctx.input_ids[:, -1:],
                attention_mask=ctx.attention_mask,
                position_ids=ctx.position_ids[:, -1:],
                past_key_values=cropped_cache(ctx.past_key_values, T - 1),
                use_cache=True,
                logits_to_keep=1,
            )
        return out.logits[:, -1].float()

"""`BiasTuner`: the forwards and the backward of one bias-tuning step, batched over rows.

What θ fixes is never recomputed: which piece serves which scope and precision (`replay`,
`rerun`, `vocab_pass`, `precision`) is in docs/design.md, "Bias tuning".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from workers.methods.base import MethodError
from workers.methods.biastune import (
    SCOPES,
    HookState,
    cropped_cache,
    find_sites,
    input_embedding_scale,
    module_device,
    tuning_step,
)
from workers.methods.cache_layout import engine_layout_problem
from workers.methods.estimators import GenderGeometry
from workers.methods.precision import Float32Top, float32_head
from workers.methods.replay import LinearRecord, ThetaGraph, replayable
from workers.methods.rerun import Rerun
from workers.methods.vocab_pass import ThetaLogits, expectations, head_logits

if TYPE_CHECKING:
    from workers.methods.base import StepContext
    from workers.models import LoadedLM


@dataclass
class Probe:
    """θ's last-position logits and pooled hidden states, differentiable w.r.t. `deltas`."""

    deltas: list[torch.Tensor]  # zeros, requires_grad, (B, width) per hook point, float32
    logits: torch.Tensor  # (B, V) float32
    pooled: torch.Tensor  # (B, D) float32: mean final hidden state incl. the horizon position
    # ℓ̂_a = Σ_x p_θ(x) s_x (B,), differentiable, when `probe` was given the demographic terms
    loss_a: torch.Tensor | None = None


class BiasTuner:
    """The bias-tuning passes of one decoding step, batched over the rows of the shared loop,
    for the top `blocks` blocks (clamped to the model's depth) and a gradient `scope`: `context`
    (through the tuned blocks of every position) or `last` (θ's cached states are constants;
    only the last position and the horizon carry it)."""

    def __init__(self, lm: LoadedLM, blocks: int, scope: str) -> None:
        if scope not in SCOPES:
            raise MethodError(f"bias tuning: scope must be one of {SCOPES}, got {scope!r}")
        problem = engine_layout_problem("lidao-min", lm.model.config.to_dict())
        if problem:  # (the same check as `validate`'s, for any tuned method)
            raise MethodError(f"bias tuning on {lm.ref.id}: {problem.partition(': ')[2]}")
        self.lm = lm
        self.model = lm.model
        self.base = lm.model.base_model  # the decoder without the LM head
        self.sites = find_sites(lm.model, blocks)
        self.scope = scope
        self.embed = lm.model.get_input_embeddings().weight  # (V, D)
        self.embed_scale = input_embedding_scale(lm.model)  # Gemma: √D
        head = lm.model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise MethodError(
                f"bias tuning: the output layer of {type(lm.model).__name__} is not a Linear"
            )
        self.head = head
        half = self.embed.dtype in (torch.float16, torch.bfloat16)
        self.f32 = Float32Top(lm, self.sites) if half else None
        self.rerun = Rerun(lm, self.sites, self.f32, head)  # the tuned blocks over θ's inputs
        self.first, self.tuned_sites = self.rerun.first, self.rerun.tuned_sites
        # float32 output matrix for the tuned path of a half-precision model
        self.head_weight = float32_head(lm.model, head) if half else head.weight.detach()
        self.head_bias = None if head.bias is None else head.bias.detach().float()
        self.replay = True  # tuned forward: reuse the lower blocks' output instead of recomputing
        # fused passes over the vocabulary (`_ThetaVocab`): float32 model, E and W on one device
        self._fused = not half and self.embed.device == self.head_weight.device
        # the probe reuses the loop's forward of θ in `last` scope of a float32 model (why not
        # in half precision or `context` scope: docs/design.md, "Bias tuning")
        self.reuse_theta = not half and scope == "last"
        # `context` scope of a float32 model: the probe's re-run of the context takes the tuned
        # linear layers' outputs from θ's forwards (`LinearRecord`, recorded in `theta_forward`)
        self.linear_record = LinearRecord(
            [p for p in self.sites.block_points if replayable(p.module)]
            if not half and scope == "context"
            else []
        )
        self.theta_graph = ThetaGraph(self.model, self.sites, head, self.first)
        self.begin()

    # ---- per-batch state ---------------------------------------------------------------------

    def begin(self, batch: int | None = None) -> None:
        """Forget per-batch state (cached block inputs, running sum of context hidden states,
        float32 K/V of the tuned blocks, what θ's forwards left): call it before each batch.
        With `batch` (rows), θ's forwards inside `theta_forward` feed the probe."""
        self.rerun.begin()
        self.theta_graph.begin(self.zero_deltas(batch) if batch and self.reuse_theta else None)
        self.linear_record.begin(batch)
        self.replayed = False  # whether the last `context` probe replayed θ's linear outputs

    @contextmanager
    def theta_forward(self, batch: int) -> Iterator[None]:
        """Around the shared loop's forward of θ: through zero offsets that require grad (`last`
        scope of a float32 model, `ThetaGraph`), recording the tuned linear layers' outputs
        (`context` scope of a float32 model, `LinearRecord`), else a plain `no_grad` forward.
        """
        if self.linear_record.covers(batch):
            with torch.no_grad(), self.linear_record.recording(batch):
                yield
            return
        if not self.theta_graph.covers(batch):
            self.theta_graph.zeros = None
            self.linear_record.out = None
            with torch.no_grad():
                yield
            return
        with self.theta_graph.forward():
            yield

    # ---- the probe ---------------------------------------------------------------------------

    def zero_deltas(self, batch: int) -> list[torch.Tensor]:
        """Zero float32 offsets that require grad, (batch, width) on each hook point's device."""
        return [
            torch.zeros(
                (batch, p.width),
                dtype=torch.float32,
                device=module_device(p.module, self.lm.device),
                requires_grad=True,
            )
            for p in self.tuned_sites.points
        ]

    def probe(
        self,
        ctx: StepContext,
        demographic: tuple[GenderGeometry, torch.Tensor | None] | None = None,
    ) -> Probe:
        """θ's step through zero offsets, for the losses; must run with autograd enabled.

        With `demographic` = (gender geometry, (B, D) sum of generated embeddings or None
        before the first token), the probe also returns ℓ̂_a (`Probe.loss_a`), computed in the
        same pass over the vocabulary as the horizon's expected embedding.
        """
        B, T = ctx.input_ids.shape
        graph = self.theta_graph
        if graph.covers(B) and graph.hidden is not None and graph.positions == T:
            # `last` scope from θ's own forward of this step: only the horizon is computed here
            assert graph.zeros is not None and graph.final is not None
            deltas, hidden = graph.zeros, graph.hidden
            graph.cache = ctx.past_key_values
            context_sum = self.rerun.sum_through_last(ctx, graph.final)
            logits = ThetaLogits.apply(hidden, ctx.logits.float(), self.head_weight)
            with self.rerun.tuned(deltas) as state:
                cache = cropped_cache(ctx.past_key_values, T)
                args = (deltas, hidden, logits, cache, context_sum)
                return self._with_horizon(ctx, demographic, state, graph.fired, *args)
        states = self.rerun.inputs(ctx)
        deltas = self.zero_deltas(B)
        mask = ctx.attention_mask
        with self.rerun.tuned(deltas) as state:
            if self.scope == "context":
                with self.linear_record.replaying(B, T) as self.replayed:
                    out = self.rerun.top(ctx, slice(0, T), states, DynamicCache())
                final = state.final_hidden[-1].float()  # (B, T, D)
                context_sum = (final * mask.to(final.device).unsqueeze(-1).float()).sum(1)
            else:
                out = self.rerun.top(
                    ctx, slice(T - 1, T), states[:, -1:], self.rerun.theta_cache(ctx, T - 1)
                )
                context_sum = self.rerun.sum_through_last(ctx, state.final_hidden[-1][:, -1])
            hidden = out.last_hidden_state[:, -1]  # (B, D)
            if self.f32 is not None:  # θ's float32 K/V of the tuned blocks, before the horizon's
                self.rerun.kv32 = [
                    (x.keys.detach(), x.values.detach())
                    for x in out.past_key_values.layers[self.first :]
                ]
            if self.f32 is None:  # θ's logits from the loop, exact at δ = 0
                logits = ThetaLogits.apply(hidden, ctx.logits.float(), self.head_weight)
            else:  # the loop's half-precision logits would round p_θ: recompute in float32
                logits = head_logits(hidden, self.head_weight, self.head_bias).to(ctx.logits.device)
            # θ's cache (views) for the lower blocks, the probe's for the tuned ones: T positions
            cache = cropped_cache(ctx.past_key_values, T)
            cache.layers[self.first :] = out.past_key_values.layers[self.first :]
            args = (deltas, hidden, logits, cache, context_sum)
            return self._with_horizon(ctx, demographic, state, state.fired, *args)

    def _with_horizon(
        self,
        ctx: StepContext,
        demographic: tuple[GenderGeometry, torch.Tensor | None] | None,
        state: HookState,
        fired: set[str],
        deltas: list[torch.Tensor],
        hidden: torch.Tensor,
        logits: torch.Tensor,
        cache: Any,
        context_sum: torch.Tensor,
    ) -> Probe:
        """The probe, after one more position through the offsets' hooks (`state`) whose input
        embedding is Eᵀ p_θ(·) (kept differentiable in p) over `cache`; `pooled` is the mean
        final hidden state over the real positions (`context_sum`) and that horizon. Every
        hook point must have run (`fired`)."""
        embeds, loss_a = expectations(
            ctx, hidden, logits, demographic, self.embed, self.head_weight, self._fused
        )
        self._horizon_forward(ctx, logits, cache, embeds)
        horizon = state.final_hidden[-1][:, -1].float()  # (B, D)
        missing = [p.name for p in self.tuned_sites.points if p.name not in fired]
        if missing:
            raise MethodError(f"bias tuning: hook points never ran in a forward: {missing[:5]}")
        count = ctx.attention_mask.sum(-1, keepdim=True).float().to(horizon.device) + 1.0
        return Probe(deltas, logits, (context_sum.to(horizon.device) + horizon) / count, loss_a)

    def _horizon_forward(
        self, ctx: StepContext, logits: torch.Tensor, cache: Any, embeds: torch.Tensor | None
    ) -> None:
        """The horizon's forward (`embeds` (B, 1, D) when the fused pass computed them; a
        phase of `benchmarks/method_phases.py`)."""
        if embeds is None:
            probs = torch.softmax(logits, dim=-1)
            embeds = (probs.to(self.embed.device, self.embed.dtype) @ self.embed).unsqueeze(1)
        if self.embed_scale != 1.0:  # what the embedding module applies to ids
            embeds = embeds * self.embed_scale
        ones = torch.ones_like(ctx.attention_mask[:, :1])
        self.base(
            inputs_embeds=embeds,
            attention_mask=torch.cat([ctx.attention_mask, ones], dim=-1),
            position_ids=ctx.position_ids[:, -1:] + 1,
            past_key_values=cache,
            use_cache=True,
        )

    # ---- the step and the tuned distribution -------------------------------------------------

    def step(
        self, probe: Probe, losses: torch.Tensor, ok: torch.Tensor, lr: float
    ) -> list[torch.Tensor]:
        """Offsets after one fresh-Adam step (eps scaled to the row: `tuning_step`) on
        Σ_s losses[s] over the rows where `ok`.

        Rows not `ok` (finished, failed, non-finite loss) get zero offsets.
        """
        total = torch.where(ok, losses, torch.zeros_like(losses)).sum()
        grads = torch.autograd.grad(total, probe.deltas, allow_unused=True)
        out = [  # NaN rows cannot leak into δ
            torch.zeros_like(d) if g is None else torch.where(ok.to(g.device)[:, None], g, 0.0)
            for g, d in zip(grads, probe.deltas)
        ]
        return tuning_step(out, lr)

    def tuned_logits(self, ctx: StepContext, deltas: Sequence[torch.Tensor]) -> torch.Tensor:
        """(B, V) float32 last-position logits under θ + δ, over θ's cache of the other positions."""
        T = ctx.input_ids.shape[1]
        cache = self.rerun.theta_cache(ctx, T - 1)
        with torch.no_grad(), self.rerun.tuned([d.detach() for d in deltas]):
            states = self.rerun.inputs(ctx)[:, -1:] if self.replay else None
            out = self.rerun.top(ctx, slice(T - 1, T), states, cache)
            logits = head_logits(out.last_hidden_state[:, -1], self.head_weight, self.head_bias)
        return logits.to(ctx.logits.device)

"""The re-run of the tuned blocks over what θ fixed, for the probe and the tuned forward: the
lower blocks are skipped, their output taken from the loop's hidden states (docs/design.md,
"Bias tuning"); in half precision over the float32 copies and θ's float32 K/V.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from workers.methods.base import MethodError
from workers.methods.biastune import (
    HookState,
    TuneSites,
    bias_offsets,
    cropped_cache,
    skip_blocks,
)

if TYPE_CHECKING:
    from workers.methods.base import StepContext
    from workers.methods.precision import Float32Top
    from workers.models import LoadedLM


class Rerun:
    """The tuned blocks (`sites`, on the float32 copies `f32` in half precision) re-run over
    θ's block inputs, the lower blocks skipped; per batch it keeps those inputs, the running sum
    of θ's final hidden states (`last` scope) and, in half precision, θ's float32 K/V of the
    tuned blocks. `head` is the LM's output layer."""

    def __init__(
        self, lm: LoadedLM, sites: TuneSites, f32: Float32Top | None, head: nn.Linear
    ) -> None:
        self.lm = lm
        self.model = lm.model
        self.base = lm.model.base_model  # the decoder without the LM head
        self.sites = sites
        self.f32 = f32
        self.tuned_sites = f32.sites if f32 else sites
        self.head = head
        self.first = sites.num_blocks - sites.k  # index of the first tuned block
        block_list = lm.model.get_submodule(sites.blocks_path)
        self.lower: list[nn.Module] = list(block_list.children())[: self.first]  # θ-only blocks
        self.tuple_blocks, self.hidden_is_norm = self._inspect()
        self.begin()

    def begin(self) -> None:
        """Forget per-batch state (cached block inputs, running sum of context hidden states,
        float32 K/V of the tuned blocks)."""
        self.states: torch.Tensor | None = None  # (B, T, D) inputs of the first tuned block
        self.ctx_sum: torch.Tensor | None = None  # `last`: Σ θ final hidden over positions < T
        self.ctx_len = -1  # T the sum is valid for
        self.kv32: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # half precision only

    def _inspect(self) -> tuple[bool, bool]:
        """(blocks return tuples, θ's last hidden state is the final norm's output) of this LM."""
        outputs: list[Any] = []
        block = self.model.get_submodule(self.sites.blocks_path)[0]
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.lm.device)
        handle = block.register_forward_hook(lambda m, a, o: outputs.append(o))
        try:
            with torch.no_grad(), bias_offsets(self.model, self.sites, None) as state:
                # (not output_hidden_states: transformers 5 leaves its capture hooks registered)
                out = self.base(input_ids=ids, use_cache=False)
        finally:
            handle.remove()
        last = out.last_hidden_state
        norm_out = state.final_hidden[-1].to(last.device)
        width = self.head.weight.shape[1]
        if norm_out.shape[-1] != width:
            raise MethodError(
                f"bias tuning: the LM head of {self.lm.ref.id} reads {width}-wide states, but "
                f"{self.sites.pool.name} (pooled for the attribute head) gives "
                f"{norm_out.shape[-1]}; this layout is not mapped"
            )
        return isinstance(outputs[0], tuple), bool(torch.equal(last, norm_out))

    def output(self, states: torch.Tensor) -> Any:
        """`states` in the structure the lower blocks return (Falcon: a tuple)."""
        return (states, None) if self.tuple_blocks else states

    def inputs(self, ctx: StepContext) -> torch.Tensor:
        """(B, T, D) inputs of the first tuned block at every position, from θ's forwards.

        Grown by the loop's hidden states of each new position; recomputed (no grad) only when
        they are missing (a StepContext without hidden states, e.g. in unit tests).
        """
        T, hidden, states = ctx.input_ids.shape[1], ctx.hidden_states, self.states
        if states is not None and states.shape[1] == T:
            return states  # already grown for this step (the probe, then the tuned pass)
        new = None
        if hidden is not None and len(hidden) == self.sites.num_blocks + 1:
            new = hidden[self.first].detach()
        if new is not None and new.shape[1] == T:
            self.states = new
        elif new is not None and states is not None and states.shape[1] + new.shape[1] == T:
            self.states = torch.cat([states, new.to(states.device)], dim=1)
        else:
            self.states = self._recompute(ctx)
        return self.states

    def _recompute(self, ctx: StepContext) -> torch.Tensor:
        seen: list[torch.Tensor] = []
        block = self.model.get_submodule(self.sites.blocks_path)[self.first]

        def grab(module: nn.Module, args: Any, kwargs: Any) -> None:
            seen.append(args[0] if args else kwargs["hidden_states"])

        handle = block.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with torch.no_grad():
                self.base(
                    input_ids=ctx.input_ids,
                    attention_mask=ctx.attention_mask,
                    position_ids=ctx.position_ids,
                    use_cache=False,
                )
        finally:
            handle.remove()
        return seen[0].detach()

    @contextmanager
    def tuned(self, deltas: Sequence[torch.Tensor] | None) -> Iterator[HookState]:
        """Hooks adding `deltas`, on the float32 copies where the model is in half precision."""
        with self.f32.swapped() if self.f32 else nullcontext():
            with bias_offsets(self.model, self.tuned_sites, deltas) as state:
                yield state

    def top(
        self, ctx: StepContext, positions: slice, states: torch.Tensor | None, cache: Any
    ) -> Any:
        """The decoder over `positions` with the lower blocks replaced by `states` (no recompute;
        None: computed)."""
        with skip_blocks(self.lower, self.output(states)) if states is not None else nullcontext():
            return self.base(
                input_ids=ctx.input_ids[:, positions],
                attention_mask=ctx.attention_mask,
                position_ids=ctx.position_ids[:, positions],
                past_key_values=cache,
                use_cache=True,
            )

    def theta_cache(self, ctx: StepContext, length: int) -> Any:
        """θ's cache over the first `length` positions, as views; in a half-precision model the
        tuned blocks' layers hold θ's float32 K/V from the float32 copies instead of θ's rounded ones
        (kept from the last probe, else recomputed from the cached block inputs).
        """
        cache = cropped_cache(ctx.past_key_values, length)
        if self.f32 is None or length == 0:
            return cache
        kv = self.kv32
        if kv is None or kv[0][0].shape[0] != ctx.input_ids.shape[0] or kv[0][0].shape[-2] < length:
            states = self.inputs(ctx)[:, :length]
            head = replace(ctx, attention_mask=ctx.attention_mask[:, :length])
            with torch.no_grad(), self.tuned(None):
                out = self.top(head, slice(0, length), states, DynamicCache())
            kv = self.kv32 = [(x.keys, x.values) for x in out.past_key_values.layers[self.first :]]
        for layer, (keys, values) in zip(cache.layers[self.first :], kv):
            layer.keys, layer.values = keys[..., :length, :], values[..., :length, :]
            layer.dtype = keys.dtype
        return cache

    def sum_through_last(self, ctx: StepContext, final_last: torch.Tensor) -> torch.Tensor:
        """`last` scope: (B, D) Σ of θ's final hidden states over the real positions, the last
        one being `final_last` (differentiable); the running sum keeps it for the next step
        (θ: δ is zero in the probe)."""
        before = self.context_sum(ctx)  # positions < T - 1, kept from the last probe
        mask = ctx.attention_mask[:, -1:].to(final_last.device).float()
        last = final_last.float() * mask
        self.ctx_sum, self.ctx_len = before + last.detach(), ctx.input_ids.shape[1] + 1
        return before.to(last.device) + last

    def context_sum(self, ctx: StepContext) -> torch.Tensor:
        """Σ of θ's final hidden states over the real positions before the last one."""
        T = ctx.input_ids.shape[1]
        if self.ctx_sum is not None and self.ctx_len == T:
            return self.ctx_sum
        if T == 1:  # (as wide as what the LM head reads: OPT-350m's project_out changes it)
            width = self.head.weight.shape[1]
            return torch.zeros((ctx.input_ids.shape[0], width), device=self.lm.device)
        mask = ctx.attention_mask[:, :-1].unsqueeze(-1).float()
        hidden = ctx.hidden_states
        if self.hidden_is_norm and hidden is not None and hidden[-1].shape[1] == T:
            final = hidden[-1][:, :-1].float()  # the loop's prefill: every position
        else:
            # θ's context through the modules the tuned path runs (a half-precision model's
            # float32 copies, which the probe has swapped in already when it calls this)
            states = self.inputs(ctx)
            with torch.no_grad(), self.tuned(None) as state:
                self.top(ctx, slice(0, T - 1), states[:, :-1], DynamicCache())
            final = state.final_hidden[-1].float()
        return (final * mask.to(final.device)).sum(1)

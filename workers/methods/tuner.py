"""`BiasTuner`: the forwards and the backward of one bias-tuning step, batched over rows.

What θ fixes is never recomputed. In `last` scope of a float32 model the probe differentiates
the shared loop's own forward of θ, run through zero offsets (`theta_forward`): it computes
only the horizon position. Otherwise (`context` scope, half precision, hand-built step
contexts) the probe re-runs the tuned blocks: the blocks below them give the same states under θ and θ + δ, so their output at
every position comes from the loop's hidden states: in `context` scope the tuner keeps, per
batch, the states entering the first tuned block for every position (one more per token) and
re-runs only the top k blocks over them; in `last` scope it runs the top k blocks on the last
position only, over θ's cache. In `context` scope of a float32 model the re-run's linear
layers compute nothing either: they return the outputs θ's forwards recorded for those
positions (`_Replay`), so only norms, activations and attention are recomputed for the graph.
The probe's logits are θ's logits from the loop (their gradient is one product with the output
matrix, no forward product); the tuned forward replays the lower blocks too.

Gradient scopes: `context` differentiates as if the tuned blocks of every position were
recomputed with δ; `last` treats θ's cached states as constants (only the last position and
the horizon carry gradient).

Precision: in a half-precision model an offset of 0.006 rounds away on any activation of
magnitude ≥ 2, so the tuned path (the top k blocks, the final norm and the output product)
runs on float32 copies of those modules while θ's own forward and the lower blocks stay in the
model's dtype; the copies get float32 rotary cos/sin and attend over float32 K/V of θ. The
measurements behind this choice: `docs/design.md` (Bias tuning, precision policy).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workers.methods.base import MethodError
from workers.methods.biastune import (
    SCOPES,
    HookState,
    TuneSites,
    bias_offsets,
    cropped_cache,
    find_sites,
    module_device,
    shadowed_forwards,
    skip_blocks,
    tuning_step,
)
from workers.methods.estimators import (
    GenderGeometry,
    demographic_loss,
    demographic_scores,
    scores_from_products,
)

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


class _ThetaLogits(torch.autograd.Function):
    """θ's logits as the value, `hidden @ Wᵀ` as the derivative: no second forward product."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor) -> Any:
        ctx.save_for_backward(weight)
        ctx.hidden_meta = (hidden.dtype, hidden.device)
        return logits.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (weight,) = ctx.saved_tensors
        dtype, device = ctx.hidden_meta
        g = grad.to(device=weight.device, dtype=weight.dtype) @ weight  # (B, D)
        return g.to(device=device, dtype=dtype), None, None


class _Replay(torch.autograd.Function):
    """A linear layer's output over the context from θ's forwards (`out`), with the derivative
    of `x Wᵀ + b` (GPT-2's Conv1D: `x W + b`) w.r.t. its input: no forward product.

    Valid at δ = 0, where every input of a tuned linear layer is θ's: the value is the one θ's
    own forward computed for those positions.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, out: torch.Tensor, weight: torch.Tensor, transposed: bool
    ) -> Any:
        ctx.save_for_backward(weight)
        ctx.transposed = transposed
        return out.clone()  # the model may modify it in place (Falcon adds to its MLP output)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (weight,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return (grad @ weight.T if ctx.transposed else grad @ weight), None, None, None


def replayable(module: nn.Module) -> bool:
    """A tuned site whose output `_Replay` can stand for: a float32 nn.Linear or GPT-2 Conv1D
    with a plain weight, and no instance `forward` (accelerate's device wrappers)."""
    linear = isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
    weight = getattr(module, "weight", None)
    return (
        linear
        and weight is not None
        and type(weight) in (nn.Parameter, torch.Tensor)
        and weight.dtype == torch.float32
        and weight.ndim == 2
        and "forward" not in vars(module)
    )


CPU_VOCAB_CHUNK = 1024  # rows of the output matrix per product on a CPU (see _vocab_chunk)


def _vocab_chunk(matrix: torch.Tensor) -> int:
    """Rows of a (V, D) matrix per product in the tuner's passes over the vocabulary.

    On a CPU, (B, D) @ E_cᵀ over chunks of 1,024 rows computes the same dot products as the
    whole product (bit-identical on the development machine) for ~30 % less CPU time at B = 8
    (each chunk stays in cache while it is used), and two products with the same chunk read it
    once. On an accelerator, one product per matrix.
    """
    return CPU_VOCAB_CHUNK if matrix.device.type == "cpu" else int(matrix.shape[0])


def chunked_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(B, V) `hidden @ weightᵀ`, computed over row chunks of `weight` (the same dot products)."""
    step = _vocab_chunk(weight)
    if step >= weight.shape[0]:
        return hidden @ weight.T
    out = torch.empty((hidden.shape[0], weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
    for i in range(0, weight.shape[0], step):
        torch.mm(hidden, weight[i : i + step].T, out=out[:, i : i + step])
    return out


def _same_matrix(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same matrix (tied input and output embeddings)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def vocab_forward(
    probs: torch.Tensor, embed: torch.Tensor, weight: torch.Tensor, gen_sum: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One pass over the vocabulary: (Eᵀp, Wᵀp, (E S)ᵀ or None), all float32, no gradient.

    Eᵀp is the horizon's expected embedding, Wᵀp (the same tensor when E and W are tied) is
    what the backward of softmax + output layer needs, and (E S)ᵀ (B, V) is ℓ̂_a's product with
    the sum S of generated embeddings (`gen_sum`; None: S = 0, skipped).
    """
    tied = _same_matrix(weight, embed)
    step = _vocab_chunk(embed)
    B, V = probs.shape
    m = torch.zeros((B, embed.shape[1]), dtype=embed.dtype, device=embed.device)
    pw = m if tied else torch.zeros((B, weight.shape[1]), dtype=weight.dtype, device=weight.device)
    es = None if gen_sum is None else torch.empty((B, V), dtype=embed.dtype, device=embed.device)
    with torch.no_grad():
        for i in range(0, V, step):
            rows = slice(i, i + step)
            chunk = embed[rows]
            m.addmm_(probs[:, rows], chunk)
            if not tied:
                pw.addmm_(probs[:, rows], weight[rows])
            if es is not None and gen_sum is not None:
                torch.mm(gen_sum, chunk.T, out=es[:, rows])
    return m, pw, es


class _ThetaVocab(torch.autograd.Function):
    """(Eᵀp_θ, Σ_x p_θ(x) s_x) as functions of θ's last final hidden state, p_θ = softmax(h Wᵀ).

    The values come from `vocab_forward` (θ's logits are the loop's: no forward product); the
    backward is one pass over the vocabulary: with dp = E g_m + g_a s and κ = Σ_x p_x dp_x,
    ∂/∂h = Σ_x p_x dp_x W_x − κ Wᵀp (softmax's Jacobian folded in), each chunk of E and W used
    for both of its products while it is in cache.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        probs: torch.Tensor,
        m: torch.Tensor,
        pw: torch.Tensor,
        scores: torch.Tensor,
        embed: torch.Tensor,
        weight: torch.Tensor,
    ) -> Any:
        ctx.save_for_backward(probs, pw, scores, embed, weight)
        ctx.hidden_meta = (hidden.dtype, hidden.device)
        return m.clone(), (probs * scores).sum(-1)

    @staticmethod
    def backward(ctx: Any, grad_m: torch.Tensor, grad_a: torch.Tensor) -> Any:
        probs, pw, scores, embed, weight = ctx.saved_tensors
        dtype, device = ctx.hidden_meta
        tied = _same_matrix(weight, embed)
        step = _vocab_chunk(embed)
        B, V = probs.shape
        grad_m = grad_m.to(embed.device, embed.dtype)
        grad_a = grad_a.to(embed.device, embed.dtype).unsqueeze(-1)
        acc = torch.zeros((B, weight.shape[1]), dtype=weight.dtype, device=weight.device)
        kappa = torch.zeros((B, 1), dtype=weight.dtype, device=weight.device)
        for i in range(0, V, step):
            rows = slice(i, i + step)
            chunk = embed[rows]
            wdp = probs[:, rows] * torch.addcmul(grad_m @ chunk.T, grad_a, scores[:, rows])
            acc.addmm_(wdp, chunk if tied else weight[rows])
            kappa += wdp.sum(-1, keepdim=True)
        grad_h = acc - kappa * pw
        return grad_h.to(device=device, dtype=dtype), None, None, None, None, None, None


# float32 copies of a half-precision model's blocks, final norm and output matrix, by model:
# every tuner of the model (each method, UDDIA's redo with fewer blocks) swaps in the same ones
_FLOAT32_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def _float32_copies(model: nn.Module) -> dict[str, Any]:
    return _FLOAT32_COPIES.setdefault(model, {})


def float32_head(model: nn.Module, head: nn.Linear) -> torch.Tensor:
    """The output matrix in float32, one copy per model."""
    copies = _float32_copies(model)
    if "head" not in copies:
        copies["head"] = head.weight.detach().float()
    return copies["head"]  # type: ignore[no-any-return]


class _Float32Top:
    """float32 copies of the tuned blocks and the final norm, swapped in for the tuned passes.

    Built only for a half-precision model; the originals stay in place for θ's forwards. The
    copies are made once per model and block (`_FLOAT32_COPIES`): tuners of the same model share
    them, and one with fewer blocks uses the top ones of a deeper one's (hooks that install the
    offsets come and go with each pass, so sharing carries no state).
    """

    def __init__(self, model: nn.Module, sites: TuneSites) -> None:
        self.model = model
        blocks = model.get_submodule(sites.blocks_path)
        first = sites.num_blocks - sites.k
        copies = _float32_copies(model)
        rotary = getattr(
            model.get_submodule(sites.blocks_path.rpartition(".")[0]), "rotary_emb", None
        )
        self.swaps: list[tuple[nn.Module, str, nn.Module]] = []
        for i in range(first, sites.num_blocks):
            name = f"block.{i}"
            if name not in copies:
                block = copy.deepcopy(blocks.get_submodule(str(i))).float()
                # any block may be a tuner's first: its hidden-state input arrives in half
                block.register_forward_pre_hook(_inputs_to_float32, with_kwargs=True)
                if isinstance(rotary, nn.Module):  # LLaMA, Falcon: cos/sin in the model's dtype
                    block.register_forward_pre_hook(_float32_rotary(rotary), with_kwargs=True)
                copies[name] = block
            self.swaps.append((blocks, str(i), copies[name]))
        parent_name, _, attr = sites.final_norm.name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if "final_norm" not in copies:
            copies["final_norm"] = copy.deepcopy(sites.final_norm.module).float()
        self.swaps.append((parent, attr, copies["final_norm"]))
        with self.swapped():
            self.sites = find_sites(model, sites.k)

    @contextmanager
    def swapped(self) -> Iterator[None]:
        saved = [(parent, name, parent.get_submodule(name)) for parent, name, _ in self.swaps]
        try:
            for parent, name, module in self.swaps:
                parent._modules[name] = module
            yield
        finally:
            for parent, name, module in saved:
                parent._modules[name] = module


def _inputs_to_float32(module: nn.Module, args: Any, kwargs: Any) -> Any:
    """Pre-hook of the first float32 block: its hidden-state input arrives in the model's dtype."""
    if args and isinstance(args[0], torch.Tensor):
        args = (args[0].float(), *args[1:])
    elif isinstance(kwargs.get("hidden_states"), torch.Tensor):
        kwargs = {**kwargs, "hidden_states": kwargs["hidden_states"].float()}
    return args, kwargs


def _float32_rotary(rotary: nn.Module) -> Any:
    """Pre-hook of a float32 block: rotary cos/sin recomputed in float32 from the positions."""

    def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
        given, positions = kwargs.get("position_embeddings"), kwargs.get("position_ids")
        if isinstance(given, tuple) and given[0].dtype != torch.float32 and positions is not None:
            probe = given[0].new_empty(0, dtype=torch.float32)  # the rotary reads dtype and device
            kwargs = {**kwargs, "position_embeddings": rotary(probe, positions)}
        return args, kwargs

    return hook


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
        self.lm = lm
        self.model = lm.model
        self.base = lm.model.base_model  # the decoder without the LM head
        self.sites = find_sites(lm.model, blocks)
        self.scope = scope
        self.embed = lm.model.get_input_embeddings().weight  # (V, D)
        head = lm.model.get_output_embeddings()
        if not isinstance(head, nn.Linear):
            raise MethodError(
                f"bias tuning: the output layer of {type(lm.model).__name__} is not a Linear"
            )
        self.head = head
        self.first = self.sites.num_blocks - self.sites.k  # index of the first tuned block
        block_list = lm.model.get_submodule(self.sites.blocks_path)
        self.lower: list[nn.Module] = list(block_list.children())[: self.first]  # θ-only blocks
        half = self.embed.dtype in (torch.float16, torch.bfloat16)
        attention = str(getattr(lm.model.config, "_attn_implementation", None) or "")
        if half and attention.startswith("flash_attention"):
            raise MethodError(
                f"bias tuning: the tuned blocks of a half-precision model run in float32, which "
                f"{attention} does not take; load {lm.ref.id} with attn_implementation sdpa "
                f"or eager"
            )
        self.f32 = _Float32Top(lm.model, self.sites) if half else None
        self.tuned_sites = self.f32.sites if self.f32 else self.sites
        # float32 output matrix for the tuned path of a half-precision model
        self.head_weight = float32_head(lm.model, head) if half else head.weight.detach()
        self.head_bias = None if head.bias is None else head.bias.detach().float()
        self.replay = True  # tuned forward: reuse the lower blocks' output instead of recomputing
        # fused passes over the vocabulary (`_ThetaVocab`): float32 model, E and W on one device
        self._fused = not half and self.embed.device == self.head_weight.device
        # the probe reuses the shared loop's forward of θ (`theta_forward`): `last` scope of a
        # float32 model (a half-precision θ forward cannot stand for the float32 tuned path;
        # `context` scope re-runs the context batched, faster than θ's graph position by
        # position: docs/design.md)
        self.reuse_theta = not half and scope == "last"
        # `context` scope of a float32 model: the probe's re-run of the context takes the tuned
        # linear layers' outputs from θ's forwards (`_Replay`, recorded in `theta_forward`)
        self.replay_points: list[Any] = (
            [p for p in self.sites.points[:-1] if replayable(p.module)]
            if not half and scope == "context"
            else []
        )
        self._tuple_blocks, self._hidden_is_norm = self._inspect()
        self.begin()

    # ---- per-batch state ---------------------------------------------------------------------

    def begin(self, batch: int | None = None) -> None:
        """Forget per-batch state (cached block inputs, running sum of context hidden states,
        float32 K/V of the tuned blocks, what θ's forwards left): call it before each batch.
        With `batch` (rows), θ's forwards inside `theta_forward` feed the probe."""
        self._states: torch.Tensor | None = None  # (B, T, D) inputs of the first tuned block
        self._ctx_sum: torch.Tensor | None = None  # `last`: Σ θ final hidden over positions < T
        self._ctx_len = -1  # T the sum is valid for
        self._kv32: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # half precision only
        # θ's forwards through zero offsets (`theta_forward`): the offsets (leaves), the last
        # forward's final-norm output and last hidden state at the last position (with their
        # graph), the positions the forwards covered and the loop's cache
        self._zeros = self.zero_deltas(batch) if batch and self.reuse_theta else None
        self._theta_final: torch.Tensor | None = None
        self._theta_hidden: torch.Tensor | None = None
        self._theta_fired: set[str] = set()
        self._positions = 0
        self._cache: Any = None
        # `context` scope: (B, T, width) outputs of the `replay_points` from θ's forwards of
        # every position so far, or None (not recorded for this batch)
        self._replay_out: list[torch.Tensor] | None = [] if batch and self.replay_points else None
        self._replay_rows = batch or 0
        self.replayed = False  # whether the last `context` probe replayed θ's linear outputs

    @contextmanager
    def theta_forward(self, batch: int) -> Iterator[None]:
        """Around the shared loop's forward of θ (`last` scope): through zero offsets that
        require grad, so the probe differentiates θ's own forward of the new position instead
        of running the tuned blocks on it again.

        Adding 0.0 changes no value, so the loop's logits, cache and hidden states are θ's. The
        graph of a forward serves its step only: the cache's tuned layers and the final hidden
        states are detached before the next forward (earlier positions are constants of θ in
        `last` scope). The prompt's forward runs without hooks (its positions before the last
        are constants too), so the first probe of a batch re-runs the last position. In
        `context` scope of a float32 model: a `no_grad` forward that records the outputs of the
        tuned linear layers for the probe's re-run (`_recording`). Without `begin(batch)` or in
        half precision: a plain `no_grad` forward.
        """
        if self._replay_out is not None and self._replay_rows == batch:
            with torch.no_grad(), self._recording(batch):
                yield
            return
        if self._zeros is None or self._zeros[0].shape[0] != batch:
            self._zeros = None
            self._replay_out = None
            with torch.no_grad():
                yield
            return
        self._detach_cache()
        self._theta_final = self._theta_hidden = None
        if self._positions == 0:
            with torch.no_grad(), bias_offsets(self.model, self.sites, None) as state:
                yield
            self._positions += state.final_hidden[-1].shape[1]
            return
        seen: list[Any] = []
        # what the output layer reads (the last hidden state; OPT's head is fed by the decoder)
        handle = self.head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        try:
            with torch.enable_grad(), bias_offsets(self.model, self.sites, self._zeros) as state:
                yield
        finally:
            handle.remove()
        final = state.final_hidden[-1]  # (B, T_new, D) final norm outputs
        self._theta_final, self._theta_hidden = final[:, -1], seen[-1][:, -1]
        self._theta_fired = state.fired
        self._positions += final.shape[1]

    @contextmanager
    def _recording(self, batch: int) -> Iterator[None]:
        """`context` scope: keep the outputs of the tuned linear layers of θ's forward, grown by
        its positions (`_replay_out`). Anything unexpected (a layer that did not run once, a
        shape that is not batch-major) turns the replay off for the batch."""
        seen: list[list[torch.Tensor]] = [[] for _ in self.replay_points]

        def keeper(store: list[torch.Tensor]) -> Any:
            # a copy, taken now: the model may add to a layer's output in place (Falcon's MLP)
            return lambda module, args, output: store.append(output.detach().clone())

        handles = [
            p.module.register_forward_hook(keeper(store))
            for p, store in zip(self.replay_points, seen)
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        ok = all(
            len(store) == 1 and store[0].shape[-1] == p.width and store[0].shape[0] % batch == 0
            for p, store in zip(self.replay_points, seen)
        )
        points = zip(self.replay_points, seen)
        new = [store[0].reshape(batch, -1, p.width) for p, store in points] if ok else []
        if not new or len({x.shape[1] for x in new}) != 1:
            self._replay_out = None
            return
        before = self._replay_out
        self._replay_out = [torch.cat(x, dim=1) for x in zip(before, new)] if before else new

    @contextmanager
    def _replaying(self, batch: int, positions: int) -> Iterator[bool]:
        """Inside: the tuned linear layers return θ's recorded outputs over `positions` through
        `_Replay` instead of computing them (yields False, changing nothing, when the record
        does not cover exactly those rows and positions)."""
        outs = self._replay_out
        if not outs or outs[0].shape[:2] != (batch, positions):
            yield False
            return
        replays = [
            (p.module, self._replay_forward(p, out)) for p, out in zip(self.replay_points, outs)
        ]
        with shadowed_forwards(replays):
            yield True

    @staticmethod
    def _replay_forward(point: Any, out: torch.Tensor) -> Any:
        weight = point.module.weight
        transposed = not isinstance(point.module, nn.Linear)  # Conv1D stores (in, out)

        def forward(*args: Any, **kwargs: Any) -> Any:
            x = args[0] if args else next(iter(kwargs.values()))
            if x.shape[:-1].numel() != out.shape[:-1].numel():
                raise MethodError(
                    f"bias tuning: {point.name} got {tuple(x.shape)} in the context re-run, "
                    f"θ's recorded output is {tuple(out.shape)}"
                )
            return _Replay.apply(x, out.reshape(*x.shape[:-1], out.shape[-1]), weight, transposed)

        return forward

    def _detach_cache(self) -> None:
        """The K/V of earlier forwards become constants of θ (no graph kept)."""
        if self._cache is not None:
            for layer in self._cache.layers[self.first :]:
                layer.keys, layer.values = layer.keys.detach(), layer.values.detach()

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
        return isinstance(outputs[0], tuple), bool(torch.equal(last, norm_out))

    def _block_output(self, states: torch.Tensor) -> Any:
        """`states` in the structure the lower blocks return (Falcon: a tuple)."""
        return (states, None) if self._tuple_blocks else states

    def _block_inputs(self, ctx: StepContext) -> torch.Tensor:
        """(B, T, D) inputs of the first tuned block at every position, from θ's forwards.

        Grown by the loop's hidden states of each new position; recomputed (no grad) only when
        they are missing (a StepContext without hidden states, e.g. in unit tests).
        """
        T = ctx.input_ids.shape[1]
        hidden = ctx.hidden_states
        if self._states is not None and self._states.shape[1] == T:
            return self._states  # already grown for this step (the probe, then the tuned pass)
        if hidden is not None and len(hidden) == self.sites.num_blocks + 1:
            new = hidden[self.first].detach()
            if new.shape[1] == T:
                self._states = new
            elif self._states is not None and self._states.shape[1] + new.shape[1] == T:
                self._states = torch.cat([self._states, new.to(self._states.device)], dim=1)
            else:
                self._states = None
        elif self._states is not None and self._states.shape[1] != T:
            self._states = None
        if self._states is None:
            self._states = self._recompute_inputs(ctx)
        return self._states

    def _recompute_inputs(self, ctx: StepContext) -> torch.Tensor:
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

    @contextmanager
    def _tuned(self, deltas: Sequence[torch.Tensor] | None) -> Iterator[HookState]:
        """Hooks adding `deltas`, on the float32 copies where the model is in half precision."""
        with ExitStack() as stack:
            if self.f32 is not None:
                stack.enter_context(self.f32.swapped())
            yield stack.enter_context(bias_offsets(self.model, self.tuned_sites, deltas))

    def _top(
        self,
        ctx: StepContext,
        positions: slice,
        states: torch.Tensor,
        cache: Any,
    ) -> Any:
        """The decoder over `positions` with the lower blocks replaced by `states` (no recompute)."""
        skip = skip_blocks(self.lower, self._block_output(states)) if self.lower else None
        with ExitStack() as stack:
            if skip is not None:
                stack.enter_context(skip)
            return self.base(
                input_ids=ctx.input_ids[:, positions],
                attention_mask=ctx.attention_mask,
                position_ids=ctx.position_ids[:, positions],
                past_key_values=cache,
                use_cache=True,
            )

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
        if (
            self._zeros is not None
            and self._theta_hidden is not None
            and self._positions == T
            and self._zeros[0].shape[0] == B
        ):
            return self._probe_theta(ctx, demographic)
        states = self._block_inputs(ctx)
        deltas = self.zero_deltas(B)
        mask = ctx.attention_mask
        with self._tuned(deltas) as state:
            if self.scope == "context":
                from transformers.cache_utils import DynamicCache

                with self._replaying(B, T) as self.replayed:
                    out = self._top(ctx, slice(0, T), states, DynamicCache())
                final = state.final_hidden[-1].float()  # (B, T, D)
                context_sum = (final * mask.to(final.device).unsqueeze(-1).float()).sum(1)
            else:
                out = self._top(ctx, slice(T - 1, T), states[:, -1:], self._theta_cache(ctx, T - 1))
                context_sum = self._sum_through_last(ctx, state.final_hidden[-1][:, -1])
            hidden = out.last_hidden_state[:, -1]  # (B, D)
            if self.f32 is not None:  # θ's float32 K/V of the tuned blocks, before the horizon's
                self._kv32 = [
                    (x.keys.detach(), x.values.detach())
                    for x in out.past_key_values.layers[self.first :]
                ]
            if self.f32 is None:  # θ's logits from the loop, exact at δ = 0
                logits = _ThetaLogits.apply(hidden, ctx.logits.float(), self.head_weight)
            else:  # the loop's half-precision logits would round p_θ: recompute in float32
                logits = self._head_product(hidden).to(ctx.logits.device)
            cache = self._merged_cache(ctx, out.past_key_values)
            embeds, loss_a = self._expectations(ctx, hidden, logits, demographic)
            self._horizon_forward(ctx, logits, cache, embeds)
            horizon = state.final_hidden[-1][:, -1].float()  # (B, D)
        return self._pooled(state.fired, Probe(deltas, logits, horizon, loss_a), context_sum, mask)

    def _pooled(
        self, fired: set[str], probe: Probe, context_sum: torch.Tensor, mask: torch.Tensor
    ) -> Probe:
        """`probe` (its `pooled` holding the horizon's final hidden state) with the mean over
        the real positions and the horizon; every hook point must have run (`fired`)."""
        missing = [p.name for p in self.tuned_sites.points if p.name not in fired]
        if missing:
            raise MethodError(f"bias tuning: hook points never ran in a forward: {missing[:5]}")
        horizon = probe.pooled
        count = mask.sum(-1, keepdim=True).float().to(horizon.device) + 1.0  # real + horizon
        return replace(probe, pooled=(context_sum.to(horizon.device) + horizon) / count)

    def _probe_theta(
        self,
        ctx: StepContext,
        demographic: tuple[GenderGeometry, torch.Tensor | None] | None,
    ) -> Probe:
        """The `last`-scope probe from θ's own forward of this step (`theta_forward`): only the
        horizon position is computed here."""
        assert self._zeros is not None and self._theta_hidden is not None
        assert self._theta_final is not None
        T = ctx.input_ids.shape[1]
        deltas, hidden, mask = self._zeros, self._theta_hidden, ctx.attention_mask
        self._cache = ctx.past_key_values
        context_sum = self._sum_through_last(ctx, self._theta_final)
        logits = _ThetaLogits.apply(hidden, ctx.logits.float(), self.head_weight)
        with self._tuned(deltas) as state:
            embeds, loss_a = self._expectations(ctx, hidden, logits, demographic)
            self._horizon_forward(ctx, logits, cropped_cache(ctx.past_key_values, T), embeds)
            horizon = state.final_hidden[-1][:, -1].float()  # (B, D)
        probe = Probe(deltas, logits, horizon, loss_a)
        return self._pooled(self._theta_fired, probe, context_sum, mask)

    def _expectations(
        self,
        ctx: StepContext,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        demographic: tuple[GenderGeometry, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(horizon input embeddings (B, 1, D) or None, ℓ̂_a (B,) or None) of the probe.

        A float32 model with E and W on one device takes the fused passes (`_ThetaVocab`): p_θ
        enters E and W once in the forward and once in the backward. Otherwise (half precision,
        split models) the horizon embeds softmax(logits) in `_horizon_forward` and ℓ̂_a is the
        plain expectation.
        """
        gen_sum = None if demographic is None else demographic[1]
        if not self._fused:
            if demographic is None:
                return None, None
            geo = demographic[0]
            zero = torch.zeros((hidden.shape[0], geo.embed.shape[1]), device=geo.embed.device)
            scores = demographic_scores(geo, zero if gen_sum is None else gen_sum)
            return None, demographic_loss(torch.softmax(logits, dim=-1), scores)
        with torch.no_grad():
            probs = torch.softmax(ctx.logits.float().to(self.embed.device), dim=-1)
            m, pw, es = vocab_forward(probs, self.embed, self.head_weight, gen_sum)
            if demographic is None:
                scores = probs.new_zeros(()).expand(probs.shape)
            else:
                zero = torch.zeros_like(m)
                scores = scores_from_products(
                    demographic[0], zero if gen_sum is None else gen_sum, es
                )
        embeds, loss_a = _ThetaVocab.apply(
            hidden, probs, m, pw, scores, self.embed.detach(), self.head_weight
        )
        return embeds.unsqueeze(1), (loss_a if demographic is not None else None)

    def _theta_cache(self, ctx: StepContext, length: int) -> Any:
        """θ's cache over the first `length` positions, as views.

        In a half-precision model the tuned blocks' layers hold float32 K/V of θ (δ = 0) from the
        float32 copies instead of θ's rounded ones: kept from the last probe, recomputed from
        the cached block inputs when missing (once per batch in `last` scope).
        """
        cache = cropped_cache(ctx.past_key_values, length)
        if self.f32 is None or length == 0:
            return cache
        kv = self._kv32
        if kv is None or kv[0][0].shape[0] != ctx.input_ids.shape[0] or kv[0][0].shape[-2] < length:
            from transformers.cache_utils import DynamicCache

            states = self._block_inputs(ctx)[:, :length]
            head = replace(ctx, attention_mask=ctx.attention_mask[:, :length])
            with torch.no_grad(), self._tuned(None):
                out = self._top(head, slice(0, length), states, DynamicCache())
            kv = self._kv32 = [(x.keys, x.values) for x in out.past_key_values.layers[self.first :]]
        for layer, (keys, values) in zip(cache.layers[self.first :], kv):
            layer.keys, layer.values = keys[..., :length, :], values[..., :length, :]
            layer.dtype = keys.dtype
        return cache

    def _merged_cache(self, ctx: StepContext, top: Any) -> Any:
        """θ's cache (views) for the lower blocks, the probe's for the tuned ones: T positions."""
        merged = cropped_cache(ctx.past_key_values, ctx.input_ids.shape[1])
        merged.layers[self.first :] = top.layers[self.first :]
        return merged

    def _sum_through_last(self, ctx: StepContext, final_last: torch.Tensor) -> torch.Tensor:
        """`last` scope: (B, D) Σ of θ's final hidden states over the real positions, the last
        one being `final_last` (differentiable); the running sum keeps it for the next step
        (θ: δ is zero in the probe)."""
        before = self._context_sum(ctx)  # positions < T - 1, kept from the last probe
        mask = ctx.attention_mask[:, -1:].to(final_last.device).float()
        last = final_last.float() * mask
        self._ctx_sum, self._ctx_len = before + last.detach(), ctx.input_ids.shape[1] + 1
        return before.to(last.device) + last

    def _context_sum(self, ctx: StepContext) -> torch.Tensor:
        """Σ of θ's final hidden states over the real positions before the last one."""
        T = ctx.input_ids.shape[1]
        if self._ctx_sum is not None and self._ctx_len == T:
            return self._ctx_sum
        if T == 1:
            return torch.zeros((ctx.input_ids.shape[0], self.embed.shape[1]), device=self.lm.device)
        mask = ctx.attention_mask[:, :-1].unsqueeze(-1).float()
        hidden = ctx.hidden_states
        if self._hidden_is_norm and hidden is not None and hidden[-1].shape[1] == T:
            final = hidden[-1][:, :-1].float()  # the loop's prefill: every position
        else:
            states = self._block_inputs(ctx)
            with torch.no_grad(), bias_offsets(self.model, self.sites, None) as state:
                from transformers.cache_utils import DynamicCache

                self._top(ctx, slice(0, T - 1), states[:, :-1], DynamicCache())
            final = state.final_hidden[-1].float()
        return (final * mask.to(final.device)).sum(1)

    def _horizon_forward(
        self, ctx: StepContext, logits: torch.Tensor, cache: Any, embeds: torch.Tensor | None
    ) -> None:
        """One more position whose input embedding is Eᵀ p_θ(·) (kept differentiable in p);
        `embeds` (B, 1, D) when the fused pass computed it already."""
        if embeds is None:
            probs = torch.softmax(logits, dim=-1)
            embeds = (probs.to(self.embed.device, self.embed.dtype) @ self.embed).unsqueeze(1)
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
        out = []
        for g, d in zip(grads, probe.deltas):
            g = torch.zeros_like(d) if g is None else g
            keep = ok.to(g.device).unsqueeze(-1)
            out.append(torch.where(keep, g, torch.zeros_like(g)))  # NaN rows cannot leak into δ
        return tuning_step(out, lr)  # Adam's step with eps scaled to the row: docs/design.md

    def tuned_logits(self, ctx: StepContext, deltas: Sequence[torch.Tensor]) -> torch.Tensor:
        """(B, V) float32 last-position logits under θ + δ, over θ's cache of the other positions."""
        T = ctx.input_ids.shape[1]
        cache = self._theta_cache(ctx, T - 1)
        with torch.no_grad(), self._tuned([d.detach() for d in deltas]):
            if self.replay:
                states = self._block_inputs(ctx)[:, -1:]
                out = self._top(ctx, slice(T - 1, T), states, cache)
            else:
                out = self.base(
                    input_ids=ctx.input_ids[:, -1:],
                    attention_mask=ctx.attention_mask,
                    position_ids=ctx.position_ids[:, -1:],
                    past_key_values=cache,
                    use_cache=True,
                )
            logits = self._head_product(out.last_hidden_state[:, -1])
        return logits.to(ctx.logits.device)

    def _head_product(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, V) float32 logits of (B, D) final hidden states (float32 output matrix if half)."""
        weight = self.head_weight
        logits = chunked_logits(hidden.to(weight.device, weight.dtype), weight)
        if self.head_bias is not None:
            logits = logits + self.head_bias.to(logits.device)
        return logits.float()

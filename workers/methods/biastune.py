"""Per-sequence bias tuning of the top k blocks of a frozen causal LM: where the offsets go,
the hooks that add them, the tuning step, and cache views (docs/design.md, "Bias tuning").

`δ_s` is an additive (B, out_features) offset on the output of every affine sub-module of the
top `k` blocks and of the final norm; the weights are never touched. Row s of an offset only
reaches row s of the batch, so one backward of Σ_s ℓ_s gives each sequence its own gradient.
The passes of one decoding step that use these pieces live in `workers.methods.tuner`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from workers.methods.base import MethodError
from workers.structure import affine_width

SCOPES = ("context", "last")
ADAM_EPS = 1e-8  # torch.optim.Adam's default eps
# Adam's eps of the tuning step, per row and hook point, at least this fraction of the largest
# |g| of that row and hook point (`tuning_step`; docs/design.md, "What is guaranteed")
STEP_EPS_REL = 1e-3
# Attribute names of the final norm next to (or above) the decoder block list.
FINAL_NORM_NAMES = ("ln_f", "norm", "final_layer_norm", "final_norm", "norm_f", "final_layernorm")
# Attribute names of a projection between the final norm and the LM head (OPT-350m).
PROJECT_OUT_NAMES = ("project_out",)


@dataclass(frozen=True)
class HookPoint:
    """One affine sub-module whose output gets a per-sequence offset of `width` numbers."""

    name: str  # qualified name in the model, for error messages
    module: nn.Module
    width: int


@dataclass(frozen=True)
class TuneSites:
    """Where the offsets go: the affine modules of the top `k` blocks, then the final norm (when
    the model has one); and what the tuned path passes through above the blocks."""

    blocks_path: str
    num_blocks: int
    k: int
    points: tuple[HookPoint, ...]  # the blocks' points, then the final norm if there is one
    # the modules between the last block and the LM head, in order: the final norm (if any),
    # a projection out (`project_out`, if any)
    above: tuple[HookPoint, ...]
    # the module whose output the LM head reads (pooled for the attribute head): the last of
    # `above`, or the last block when there is nothing above it
    pool: HookPoint

    @property
    def has_final_norm(self) -> bool:
        return bool(self.above) and self.above[0] is self.points[-1]

    @property
    def block_points(self) -> tuple[HookPoint, ...]:
        """The hook points inside the tuned blocks (every point but the final norm)."""
        return self.points[:-1] if self.has_final_norm else self.points

    def numel(self) -> int:
        """Tuned numbers per sequence (14,080 per block of GPT-2 large, plus ln_f)."""
        return sum(p.width for p in self.points)


def _find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder block list: the first ModuleList as long as the config's layer count."""
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = getattr(text, "num_hidden_layers", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and len(module) == n_layers:
            return name, module
    kind = type(model).__name__
    raise MethodError(
        f"bias tuning: cannot find the decoder block list of {kind} (no ModuleList of "
        f"num_hidden_layers={n_layers} blocks); this architecture is not mapped"
    )


def _find_above(
    model: nn.Module, blocks_path: str, names: tuple[str, ...], accept: Any = None
) -> tuple[str, nn.Module | None] | None:
    """The first attribute named in `names` of the block list's parent or one of its
    ancestors that is a module (`accept`ed, when given): (path, module); (path, None) where the
    model declares it absent (OPT-350m's `final_layer_norm = None`); None where no ancestor has
    such an attribute."""
    parts = blocks_path.split(".")[:-1]
    while True:
        prefix = ".".join(parts)
        parent = model.get_submodule(prefix) if prefix else model
        for attr in names:
            if attr in vars(parent) or attr in parent._modules:
                module = getattr(parent, attr)
                path = f"{prefix}.{attr}" if prefix else attr
                if module is None:
                    return path, None
                if isinstance(module, nn.Module) and (accept is None or accept(module)):
                    return path, module
        if not parts:
            return None
        parts.pop()


def find_sites(model: nn.Module, k: int) -> TuneSites:
    """Hook points of the top `min(k, L)` blocks plus the final norm of a causal LM; a model that
    declares no final norm (an attribute set to None: OPT-350m's post-norm blocks) tunes its
    blocks only. `MethodError` where the block list or the final norm cannot be found, k < 1,
    or a block has no affine sub-module."""
    if k < 1:
        raise MethodError(f"bias tuning: blocks must be >= 1, got {k}")
    blocks_path, blocks = _find_blocks(model)
    k = min(k, len(blocks))
    points: list[HookPoint] = []
    for index in range(len(blocks) - k, len(blocks)):
        found = [
            HookPoint(f"{blocks_path}.{index}.{name}", module, width)
            for name, module in blocks[index].named_modules()
            if name and (width := affine_width(module)) is not None
        ]
        if not found:
            raise MethodError(f"bias tuning: block {blocks_path}.{index} has no affine sub-module")
        points.extend(found)
    above: list[HookPoint] = []
    norm = _find_above(model, blocks_path, FINAL_NORM_NAMES, lambda m: affine_width(m) is not None)
    if norm is None:
        raise MethodError(
            f"bias tuning: no final norm ({', '.join(FINAL_NORM_NAMES)}) found above "
            f"{blocks_path!r} in {type(model).__name__}; this architecture is not mapped"
        )
    if norm[1] is not None:
        points.append(HookPoint(norm[0], norm[1], affine_width(norm[1]) or 0))
        above.append(points[-1])
    project = _find_above(model, blocks_path, PROJECT_OUT_NAMES)
    if project is not None and project[1] is not None:
        above.append(HookPoint(project[0], project[1], affine_width(project[1]) or 0))
    last = len(blocks) - 1
    pool = above[-1] if above else HookPoint(f"{blocks_path}.{last}", blocks[last], 0)
    return TuneSites(
        blocks_path=blocks_path,
        num_blocks=len(blocks),
        k=k,
        points=tuple(points),
        above=tuple(above),
        pool=pool,
    )


@dataclass
class HookState:
    """What the hooks saw inside one `bias_offsets` block."""

    fired: set[str] = field(default_factory=set)
    # what the LM head read in each forward (`TuneSites.pool`'s output, offset included), (B, T, D)
    final_hidden: list[torch.Tensor] = field(default_factory=list)


def _offset_hook(point: HookPoint, delta: torch.Tensor | None, state: HookState) -> Any:
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        state.fired.add(point.name)
        offset = delta
        if offset is not None:
            batch, width = offset.shape
            if output.shape[-1] != width or output.shape[0] % batch != 0:
                raise MethodError(
                    f"bias tuning: {point.name} output {tuple(output.shape)} does not match its "
                    f"offset {tuple(offset.shape)} (batch first, features last expected)"
                )
            if offset.device != output.device or offset.dtype != output.dtype:
                # a model split across devices, or a half-precision module (see the precision
                # policy in `workers.methods.tuner`)
                offset = offset.to(device=output.device, dtype=output.dtype)
            if output.shape[0] != batch:
                # OPT's MLP flattens (B, T, W) to (B·T, W), batch-major: view it back per row.
                output = (output.view(batch, -1, width) + offset.unsqueeze(1)).view(output.shape)
            else:
                # (B, W) → (B, 1, ..., 1, W): one offset per sequence, broadcast over positions
                output = output + offset.view((batch,) + (1,) * (output.ndim - 2) + (width,))
        return output

    return hook


@contextmanager
def bias_offsets(
    model: nn.Module, sites: TuneSites, deltas: Sequence[torch.Tensor] | None
) -> Iterator[HookState]:
    """Add `deltas[i]` (B, width_i) to the output of `sites.points[i]` inside the block.

    With `deltas=None` nothing is added; what the LM head reads (`sites.pool`'s output, after
    any offset) is still captured. The hooks are removed on exit, also when the block raises.

    Raises:
        MethodError: a hook point is no longer a sub-module of `model`, or shapes disagree.
    """
    if deltas is not None and len(deltas) != len(sites.points):
        raise MethodError(f"bias tuning: {len(deltas)} offsets for {len(sites.points)} hook points")
    state = HookState()
    handles = []
    try:
        for point in (*sites.points, sites.pool):
            try:
                present = model.get_submodule(point.name) is point.module
            except AttributeError:
                present = False
            if not present:
                raise MethodError(f"bias tuning: hook point {point.name} is missing from the model")
        for i, point in enumerate(sites.points):
            delta = None if deltas is None else deltas[i]
            if delta is not None and delta.shape[-1] != point.width:
                raise MethodError(
                    f"bias tuning: offset of {point.name} has width {delta.shape[-1]}, not {point.width}"
                )
            handles.append(point.module.register_forward_hook(_offset_hook(point, delta, state)))
        # after the offsets: a final norm that is the pool point is captured with its offset
        capture = state.final_hidden.append
        handles.append(
            sites.pool.module.register_forward_hook(
                lambda m, args, out: capture(out[0] if isinstance(out, tuple) else out)
            )
        )
        yield state
    finally:
        for handle in handles:
            handle.remove()


def tuning_step(
    grads: Sequence[torch.Tensor], lr: float, eps: float = ADAM_EPS, rel: float = STEP_EPS_REL
) -> list[torch.Tensor]:
    """The offsets of one tuning step: a fresh Adam step whose eps scales with the gradient.

    `grads` are the (B, width) gradients of every hook point. Row by row: `−lr · g / (|g| + e)`
    with `e = max(eps, rel · max|g|)` over that row of every hook point, so that rounding noise
    is not amplified (docs/design.md, "What is guaranteed"). Computed in float32, returned in
    each gradient's dtype.
    """
    if not grads:
        return []
    mags = [g.float().abs() for g in grads]
    device = mags[0].device  # a model split across devices: one scale per row, on the first
    scale = torch.stack([m.amax(-1).to(device) for m in mags], -1).amax(-1, keepdim=True)
    floor = (scale * rel).clamp_min(eps)
    return [(-lr * g.float() / (m + floor.to(m.device))).to(g.dtype) for g, m in zip(grads, mags)]


def module_device(module: nn.Module, default: torch.device) -> torch.device:
    """The device of a module's first parameter or buffer (models split across devices)."""
    for param in module.parameters(recurse=True):
        return param.device
    for buffer in module.buffers(recurse=True):
        return buffer.device
    return default


def input_embedding_scale(model: Any) -> float:
    """The factor the input embedding module applies to its rows (Gemma: √D; 1.0 for most
    models), so that an expected embedding `c·Eᵀp` fed as `inputs_embeds` is what the model
    sees for ids. `MethodError` where the module is not a scaled row lookup."""
    module = model.get_input_embeddings()
    weight = module.weight
    ids = torch.arange(min(4, weight.shape[0]), device=weight.device)
    with torch.no_grad():
        rows, out = weight[ids].float(), module(ids[None])[0].float()
    scale = float((out * rows).sum() / (rows * rows).sum().clamp_min(1e-30))
    if not torch.allclose(out, rows * scale, rtol=1e-2, atol=1e-6):
        raise MethodError(
            f"bias tuning: the input embeddings of {type(model).__name__} are not a scaled "
            "lookup of their weight rows; the horizon's expected embedding cannot be formed"
        )
    return 1.0 if abs(scale - 1.0) < 1e-6 else scale


def kv_cache(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A DynamicCache of full-attention layers over (keys, values) per layer, sharing their
    storage: forwards over it append by concatenation into new tensors, never modifying them."""
    cache = DynamicCache()
    cache.layers = []
    for keys, values in pairs:
        layer = DynamicLayer()
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def cropped_cache(cache: Any, length: int) -> Any:
    """A new DynamicCache over the first `length` positions of `cache` (the shared loop's θ
    cache, never modified), sharing its storage."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise MethodError(
            f"bias tuning: expected a transformers DynamicCache, got {type(cache).__name__}"
        )
    for i, layer in enumerate(layers):
        if type(layer) is not DynamicLayer or layer.keys is None or layer.values is None:
            raise MethodError(
                f"bias tuning: cache layer {i} is a {type(layer).__name__}; only initialised "
                "full-attention DynamicLayer caches are supported (the decoding loop gives "
                "them to every layout `cache_layout.engine_layout_problem` accepts)"
            )
    return kv_cache([(x.keys[..., :length, :], x.values[..., :length, :]) for x in layers])


@contextmanager
def swapped(slots: Sequence[tuple[dict[str, Any], str, Any]]) -> Iterator[None]:
    """Inside the block, `table[key]` is `value` for each (table, key, value): a module's
    `forward` shadowed by an instance attribute (`vars(module)`; its hooks still run), a child
    swapped in `parent._modules`. What was there is put back afterwards (an instance `forward`
    already there, accelerate's device hooks, is restored, not deleted)."""
    saved: list[tuple[dict[str, Any], str, Any]] = []
    missing = object()
    try:
        for table, key, value in slots:
            saved.append((table, key, table.get(key, missing)))
            table[key] = value
        yield
    finally:
        for table, key, previous in saved:
            if previous is missing:
                table.pop(key, None)
            else:
                table[key] = previous


def skip_blocks(blocks: Sequence[nn.Module], output: Any) -> AbstractContextManager[None]:
    """Make `blocks` return `output` without computing anything, inside the block.

    For θ's blocks below the tuned ones: their last-position output is the same under θ and
    θ + δ, so the tuned forward replays the probe's instead of recomputing it. Their cache
    layers are then not extended, which is harmless for a throw-away cache view.
    """
    return swapped([(vars(block), "forward", lambda *a, **k: output) for block in blocks])

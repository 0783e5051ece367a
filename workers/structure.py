"""A causal LM's structure, found in its config and its modules, never assumed from its name.

Two levels, one vocabulary:
- `config_layout(config)`: what a config says (a config.json dict, a GGUF header's, or a loaded
  model's `config.to_dict()`): block count, hidden width, each block's attention (full or
  sliding window), the family of method defaults. Torch-free, no weights: `validate` reads it.
- `model_structure(model)`: where the pieces are in the loaded modules: the block list, the
  input embedding, the final norm (and what sits between it and the LM head), each block's
  affine sub-modules. The loader and the methods read it.

Each refuses what it cannot find (`StructureError`, naming what is missing) rather than treat
an unknown model as some known one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")
FULL, SLIDING = "full_attention", "sliding_attention"


class StructureError(ValueError):
    """A model whose structure is not what the harness can drive; says what is missing."""


@dataclass(frozen=True)
class Layout:
    """A causal LM's structure as its config states it (no weights read)."""

    model_type: str
    family: str  # method defaults' family: the model_type without a "_text" suffix
    num_blocks: int
    hidden_size: int
    # each block's attention as transformers names it (full_attention, sliding_attention, ...);
    # None where the config gives a sliding window but not which blocks use it (a GGUF header)
    attention: tuple[str, ...] | None
    sliding_window: int | None

    @property
    def full_attention_only(self) -> bool:
        """Every block attends to the whole context (a plain, unbounded key/value cache)."""
        return self.attention is not None and all(kind == FULL for kind in self.attention)

    def describe(self) -> str:
        kinds = "unstated" if self.attention is None else ", ".join(sorted(set(self.attention)))
        window = f", window {self.sliding_window}" if self.sliding_window else ""
        return (
            f"{self.model_type}: {self.num_blocks} blocks of width {self.hidden_size}, "
            f"attention {kinds}{window}"
        )


def config_layout(config: Mapping[str, Any]) -> Layout:
    """The `Layout` a config states (a multimodal config's `text_config`).

    Raises:
        StructureError: an encoder-decoder config, or one without a block count or width.
    """
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    if config.get("is_encoder_decoder") or text.get("is_encoder_decoder"):
        raise StructureError(f"{model_type or 'the model'} is an encoder-decoder, not a causal LM")
    blocks = next((text[k] for k in LAYER_KEYS if isinstance(text.get(k), int)), None)
    width = next((text[k] for k in WIDTH_KEYS if isinstance(text.get(k), int)), None)
    missing = [
        what
        for what, found in (
            (f"the block count ({' / '.join(LAYER_KEYS)})", blocks),
            (f"the hidden width ({' / '.join(WIDTH_KEYS)})", width),
        )
        if found is None
    ]
    if missing or blocks is None or width is None:
        raise StructureError(
            f"the config of {model_type or 'this model'} does not give {' or '.join(missing)}"
        )
    window = text.get("sliding_window")
    window = (
        window if isinstance(window, int) and text.get("use_sliding_window") is not False else None
    )
    kinds = text.get("layer_types")
    attention: tuple[str, ...] | None
    if isinstance(kinds, list) and len(kinds) == blocks:
        attention = tuple(str(k) for k in kinds)
    else:  # a window without the blocks that use it: transformers decides when it loads
        attention = (FULL,) * blocks if window is None else None
    family = model_type.removesuffix("_text") or "unknown"
    return Layout(model_type, family, blocks, width, attention, window)


@dataclass(frozen=True)
class Structure:
    """Where a loaded causal LM's pieces are (qualified module names)."""

    layout: Layout
    blocks: str  # the decoder block list (a ModuleList of `layout.num_blocks`)
    embedding: str  # the input token embedding
    final_norm: str | None  # the norm after the last block; None where the model has none
    # the modules between the last block and the LM head, in order (final norm, projection)
    above: tuple[str, ...]
    affine: tuple[str, ...]  # a block's affine sub-modules (Linear, Conv1D, norms), relative


def model_structure(model: Any) -> Structure:
    """The `Structure` of a loaded (or meta-device) causal LM, found from its module tree: the
    block list is the ModuleList as long as the config's block count, the final norm a norm
    module beside it (or beside an ancestor) holding one weight of the hidden width, the
    projection out a Linear beside it mapping the width to the embedding's.

    Raises:
        StructureError: no such block list, no affine module in a block, or no embedding.
    """
    from torch import nn

    layout = config_layout(model.config.to_dict())
    names = {id(m): name for name, m in model.named_modules()}
    embed = model.get_input_embeddings()
    if embed is None or id(embed) not in names:
        raise StructureError(f"{type(model).__name__}: no input embedding module")
    lists = [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) == layout.num_blocks
    ]
    if not lists:
        raise StructureError(
            f"{type(model).__name__}: no block list (a ModuleList of the config's "
            f"{layout.num_blocks} blocks)"
        )
    blocks = lists[0]
    first = model.get_submodule(blocks)[0]
    affine = tuple(n for n, m in first.named_modules() if n and affine_width(m) is not None)
    if not affine:
        raise StructureError(f"{type(model).__name__}: no affine module in block {blocks}.0")
    skip = {id(embed), id(model.get_output_embeddings())}
    norm, project = _above(model, blocks, layout.hidden_size, names, skip)
    above = tuple(x for x in (norm, project) if x is not None)
    return Structure(layout, blocks, names[id(embed)], norm, above, affine)


def _above(
    model: Any, blocks: str, width: int, names: dict[int, str], skip: set[int]
) -> tuple[str | None, str | None]:
    """(final norm, projection out): a norm of the hidden width and a Linear from it beside the
    block list, else beside its parent, and so on up (the embeddings and LM head excluded)."""
    from torch import nn

    parts = blocks.split(".")[:-1]
    norm = project = None
    while True:
        parent = model.get_submodule(".".join(parts)) if parts else model
        for m in parent.children():
            if id(m) in skip or names.get(id(m)) == blocks:
                continue
            if norm is None and _is_norm(m) and affine_width(m) == width:
                norm = names[id(m)]
            if project is None and isinstance(m, nn.Linear) and m.in_features == width:
                project = names[id(m)]
        if norm is not None or not parts:
            return norm, project
        parts.pop()


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def affine_width(module: Any) -> int | None:
    """Output width of an affine module (Linear, GPT-2 Conv1D, a *Norm with a weight), else
    None: the modules bias tuning hooks (`workers.methods.biastune`) and a block's `affine`."""
    import torch
    from torch import nn

    if isinstance(module, nn.Linear):
        return int(module.out_features)
    if type(module).__name__ == "Conv1D" and isinstance(getattr(module, "nf", None), int):
        return int(module.nf)
    weight = getattr(module, "weight", None)
    if type(module).__name__.endswith("Norm") and isinstance(weight, torch.Tensor):
        return int(weight.shape[0]) if weight.ndim == 1 else None
    return None

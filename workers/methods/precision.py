"""float32 copies of a half-precision model's tuned path, shared by every tuner of the model.

In bf16 an offset of 0.006 rounds away on any activation of magnitude ≥ 2, so the tuned path
(the top k blocks, the final norm, a `project_out`, the output product) runs on float32 copies
while θ's own forward and the lower blocks stay in the model's dtype (docs/design.md,
"Precision policy", with the measurements behind it).
"""

from __future__ import annotations

import copy
import inspect
import weakref
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workers.methods.base import MethodError
from workers.methods.biastune import TuneSites, find_sites, swapped

if TYPE_CHECKING:
    from workers.models import LoadedLM

# float32 copies of a half-precision model's blocks, final norm and output matrix, by model:
# every tuner of the model (each method, UDDIA's redo with fewer blocks) swaps in the same ones
_FLOAT32_COPIES: weakref.WeakKeyDictionary[nn.Module, dict[str, Any]] = weakref.WeakKeyDictionary()


def float32_head(model: nn.Module, head: nn.Linear) -> torch.Tensor:
    """The output matrix in float32, one copy per model."""
    copies = _FLOAT32_COPIES.setdefault(model, {})
    if "head" not in copies:
        copies["head"] = head.weight.detach().float()
    return copies["head"]  # type: ignore[no-any-return]


class Float32Top:
    """float32 copies of the tuned blocks and of what lies between them and the LM head (the
    final norm, OPT-350m's `project_out`), swapped in for the tuned passes of a half-precision
    model; made once per model and block (`_FLOAT32_COPIES`) and shared by its tuners
    (docs/design.md, "Precision policy"). FlashAttention, which refuses float32, is refused.
    """

    def __init__(self, lm: LoadedLM, sites: TuneSites) -> None:
        attention = str(getattr(lm.model.config, "_attn_implementation", None) or "")
        if attention.startswith("flash_attention"):
            raise MethodError(
                f"bias tuning: the tuned blocks of a half-precision model run in float32, which "
                f"{attention} does not take; load {lm.ref.id} with attn_implementation sdpa "
                f"or eager"
            )
        model = lm.model
        blocks = model.get_submodule(sites.blocks_path)
        first = sites.num_blocks - sites.k
        copies = _FLOAT32_COPIES.setdefault(model, {})
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
                    kind = _layer_type(model, i)  # Gemma 3: one table per layer kind
                    hook = _float32_rotary(rotary, kind)
                    block.register_forward_pre_hook(hook, with_kwargs=True)
                copies[name] = block
            self.swaps.append((blocks, str(i), copies[name]))
        for point in sites.above:
            parent_name, _, attr = point.name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            name = f"above.{point.name}"
            if name not in copies:
                copies[name] = copy.deepcopy(point.module).float()
            self.swaps.append((parent, attr, copies[name]))
        with self.swapped():
            self.sites = find_sites(model, sites.k)

    def swapped(self) -> AbstractContextManager[None]:
        return swapped([(parent._modules, name, module) for parent, name, module in self.swaps])


def _inputs_to_float32(module: nn.Module, args: Any, kwargs: Any) -> Any:
    """Pre-hook of the first float32 block: its hidden-state input arrives in the model's dtype."""
    if args and isinstance(args[0], torch.Tensor):
        args = (args[0].float(), *args[1:])
    elif isinstance(kwargs.get("hidden_states"), torch.Tensor):
        kwargs = {**kwargs, "hidden_states": kwargs["hidden_states"].float()}
    return args, kwargs


def _layer_type(model: nn.Module, index: int) -> str | None:
    """Block `index`'s attention kind where the model's rotary table depends on it (a
    `layer_types` list in the config: Gemma 3's sliding and full layers rotate with different
    bases), else None."""
    config: Any = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = getattr(text, "layer_types", None)
    return str(kinds[index]) if isinstance(kinds, list) and index < len(kinds) else None


def _float32_rotary(rotary: nn.Module, kind: str | None) -> Any:
    """Pre-hook of a float32 block: rotary cos/sin recomputed in float32 from the positions
    (with the block's layer `kind` where the rotary takes one)."""
    per_kind = kind is not None and "layer_type" in inspect.signature(rotary.forward).parameters

    def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
        given, positions = kwargs.get("position_embeddings"), kwargs.get("position_ids")
        if isinstance(given, tuple) and given[0].dtype != torch.float32 and positions is not None:
            probe = given[0].new_empty(0, dtype=torch.float32)  # the rotary reads dtype and device
            table = rotary(probe, positions, kind) if per_kind else rotary(probe, positions)
            kwargs = {**kwargs, "position_embeddings": table}
        return args, kwargs

    return hook

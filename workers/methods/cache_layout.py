"""Which model layouts the methods that touch θ's KV cache can run on, from the model's config
alone (config.json's keys: no torch, no weights), so that `validate` and the method's
constructor in the actor call the same function (docs/design.md, "Sliding-window caches").

The decoding loop gives such a model a cache that keeps every position in every layer
(`transformers.DynamicCache()` without a config: full-attention `DynamicLayer`s); a
sliding-window layer then attends through the model's own sliding mask (built from
`config.sliding_window`), so its cache can be viewed, cropped and copied like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# layer kinds (transformers' `layer_types`) whose attention a full-history cache serves: the
# window is in the model's mask, not in the cache
ENGINE_LAYER_TYPES = ("full_attention", "sliding_attention")
# methods that view, crop or rebuild θ's cache (bias tuning, PPLM)
CACHE_METHODS = ("uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod", "pplm")
# methods whose tuned distribution is `hidden @ Wᵀ (+ b)`, without the model's final softcap
TUNED_METHODS = CACHE_METHODS[:-1]


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (a multimodal one nests it in `text_config`)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """The attention kind of each layer as transformers lays out the model's cache: the
    declared `layer_types`, else sliding / chunked / full by the window fields."""
    cfg = text_config(config)
    declared = cfg.get("layer_types")
    if isinstance(declared, list):
        return [str(t) for t in declared]
    if cfg.get("use_sliding_window") is False:  # Qwen2 keeps a window size it does not use
        kind = "full_attention"
    elif cfg.get("sliding_window") is not None:
        kind = "sliding_attention"
    elif cfg.get("attention_chunk_size") is not None:
        kind = "chunked_attention"
    else:
        kind = "full_attention"
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer", 1))
    return [kind] * (layers if isinstance(layers, int) and layers > 0 else 1)


def full_history_ok(config: Mapping[str, Any]) -> bool:
    """Whether a cache of full-attention layers serves every layer of the model (the loop then
    keeps every position of every layer: `workers.decoding`)."""
    cfg = text_config(config)
    return set(layer_types(config)) <= set(ENGINE_LAYER_TYPES) and not cfg.get("kv_sharing_modes")


def engine_layout_problem(method: str, config: Mapping[str, Any]) -> str | None:
    """Why `method` cannot run on a model of `config` (config.json's keys), or None: a cache
    layer kind the engine does not handle (linear or chunked attention, KV shared between
    layers), or, for the bias-tuned methods, a softcap on the final logits (their tuned
    distribution is the output layer's product). Names the model type and the reason."""
    if method not in CACHE_METHODS:
        return None
    cfg = text_config(config)
    kind = f"model type {cfg.get('model_type', '?')}"
    kinds = layer_types(config)
    other = sorted(set(kinds) - set(ENGINE_LAYER_TYPES))
    if other:
        count = sum(k in other for k in kinds)
        return (
            f"{method} cannot run on this model ({kind}): {count} of {len(kinds)} cache layers "
            f"are {', '.join(other)}; it handles {', '.join(ENGINE_LAYER_TYPES)} layers only"
        )
    if cfg.get("kv_sharing_modes"):
        return f"{method} cannot run on this model ({kind}): its layers share keys and values"
    cap = cfg.get("final_logit_softcapping")
    if method in TUNED_METHODS and cap is not None:
        return (
            f"{method} cannot run on this model ({kind}): its final logits are softcapped "
            f"(final_logit_softcapping {cap}), which the tuned distribution does not apply"
        )
    return None

"""`harness list methods|scorers|models`: what can be named in a config, with defaults, from the
catalog after plugins load (torch-free); models from the tiny list, the paper's table and the
local Hugging Face cache."""

from __future__ import annotations

import json
from typing import Any

from jobs.catalog import (
    DEFAULT_PARAMS,
    METHODS,
    PAPER_MODELS,
    PARAM_CHOICES,
    SCORER_METRICS,
    SCORERS,
    kind_label,
    param_kind,
    scorer_param_kind,
)
from workers.hub import hub_cache


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def list_methods() -> list[str]:
    from workers.plugins import load_plugins

    load_plugins()
    lines = []
    for name in sorted(METHODS):
        lines.append(f"{name}  ({METHODS[name]})")
        for key, default in DEFAULT_PARAMS.get(name, {}).items():
            kind = kind_label(param_kind(name, key))
            choices = PARAM_CHOICES.get(key)
            extra = f", one of {', '.join(choices)}" if choices else ""
            lines.append(f"    {key}: {kind} = {_fmt(default)}{extra}")
    return lines


def list_scorers() -> list[str]:
    from workers.plugins import load_plugins
    from workers.scorers.registry import scorer_defaults

    load_plugins()  # entry-point scorers (and --include ones, already imported)
    lines = []
    for name in sorted(SCORERS):
        lines.append(f"{name}  (metric {SCORER_METRICS[name]}; {SCORERS[name]})")
        for key, default in scorer_defaults(name).items():
            kind = kind_label(scorer_param_kind(name, key, default))
            lines.append(f"    {key}: {kind} = {_fmt(default)}")
    return lines


def cached_hub_models() -> list[str]:
    """Hub ids with a snapshot in the local Hugging Face cache (usable offline)."""
    root = hub_cache()
    if not root.is_dir():
        return []
    out = []
    for d in sorted(root.glob("models--*")):
        if any((d / "snapshots").glob("*/config.json")):
            out.append(d.name[len("models--") :].replace("--", "/"))
    return out


def list_models() -> list[str]:
    from workers.tiny import TINY_FAMILIES, TINY_PREFIX

    lines = ["offline random-weight models (no download):"]
    lines += [f"    {TINY_PREFIX}{f}" for f in TINY_FAMILIES if f != "bert"]
    lines.append("models of the paper (their defaults: sampling; tuned methods' lr/blocks/tau):")
    for mid, paper in PAPER_MODELS.items():
        gen = ", ".join(f"{k} {v}" for k, v in paper["generation"].items())
        meth = ", ".join(f"{k} {v}" for k, v in paper["method"].items())
        lines.append(f"    {mid}: {gen}; {meth}; {paper['samples_per_prompt']} samples/prompt")
    cached = cached_hub_models()
    lines.append(f"in the local Hugging Face cache ({hub_cache()}): {len(cached)}")
    lines += [f"    {m}" for m in cached]
    from harness.config import ModelConfig

    lines.append("model entry fields: " + ", ".join(ModelConfig.model_fields))
    return lines


def catalog(what: str) -> list[str]:
    return {"methods": list_methods, "scorers": list_scorers, "models": list_models}[what]()

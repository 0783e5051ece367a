"""Methods by name, resolved lazily so the driver never imports torch.

Each entry is `"module:Class"`; `load_method` imports it inside the generation actor. The
torch-free side (names, parameter defaults, validation) is what the planner and config use.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

METHODS: dict[str, str] = {
    "vanilla": "workers.methods.base:Vanilla",
}

# Parameter defaults per method (torch-free), resolved into each job's `method_params`.
# A method may also declare per-model-family defaults in PAPER_DEFAULTS.
DEFAULT_PARAMS: dict[str, dict[str, Any]] = {
    "vanilla": {},
}


class UnknownMethodError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def check_method_name(name: str) -> None:
    if name not in METHODS:
        close = difflib.get_close_matches(name, list(METHODS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownMethodError(f"unknown method {name!r}{hint} (known: {', '.join(sorted(METHODS))})")


def resolve_params(name: str, params: dict[str, Any], model_id: str) -> dict[str, Any]:
    """Effective parameters of `name` for `model_id`: defaults, then model defaults, then user."""
    check_method_name(name)
    defaults = dict(DEFAULT_PARAMS.get(name, {}))
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(
            f"method {name!r}: unknown parameter(s) {unknown}; known: {sorted(defaults) or 'none'}"
        )
    resolved = {**defaults, **model_defaults(name, model_id), **params}
    return resolved


def model_defaults(name: str, model_id: str) -> dict[str, Any]:
    """Per-model defaults (the paper's hyper-parameter table); empty for unknown models."""
    return {}


def load_method(name: str) -> type[Any]:
    """Import the method class registered under `name` (inside actors only)."""
    check_method_name(name)
    module, _, attr = METHODS[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]

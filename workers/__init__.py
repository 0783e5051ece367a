"""Turning jobs into rows: the decoding loop, models, methods, scorers, and their Ray actors.

Names are resolved lazily so that importing a registry (as the driver does) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Generator": "workers.generator",
    "LoadedLM": "workers.models",
    "decode_batch": "workers.decoding",
    "load_lm": "workers.models",
    "load_method": "workers.methods.registry",
    "load_scorer": "workers.scorers.registry",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'workers' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)

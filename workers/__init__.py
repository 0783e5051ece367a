"""Turning jobs into rows: the decoding loop, models, methods, scorers, and their Ray actors
(with what an actor runs itself: the score writer, the run's cache mirror, console checks).

Names are resolved lazily so that importing a registry (as the driver does) never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CacheMirror": "workers.scorers.cache_mirror",
    "Generator": "workers.generator",
    "LoadedLM": "workers.models",
    "ScoreBuffer": "workers.scorers.score_buffer",
    "ScoringError": "workers.scorers.score_buffer",
    "decode_batch": "workers.decoding",
    "load_lm": "workers.models",
    "load_method": "workers.methods.registry",
    "load_scorer": "workers.scorers.registry",
    "scorer_context": "workers.scorers.cache_mirror",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'workers' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)

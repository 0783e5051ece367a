"""Storing and summarising rows, in three rooms: `results.run` (the run directory),
`results.stats` (joins, metrics, gaps and tests, the summary) and `results.report` (tables,
figures, reports). `results.schema` holds every Parquet table's schema.

Names are resolved lazily, so importing one room does not import the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "SCHEMA_VERSION": "results.schema",
    "all_schemas": "results.schema",
    "RunStore": "results.run.store",
    "StoreError": "results.run.store",
    "join_run": "results.stats.join",
    "joined_frame": "results.stats.join",
    "summarize": "results.stats.aggregate",
    "AggregateResult": "results.report.result",
    "aggregate_run": "results.report.build",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'results' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)

"""Storing and summarising rows: the Parquet schema and run directory, joins, aggregation, reports."""

from results.aggregate import aggregate_run, summarize
from results.join import join_run, joined_frame
from results.report import AggregateResult
from results.schema import SCHEMA_VERSION, all_schemas
from results.store import RunStore, StoreError

__all__ = [
    "SCHEMA_VERSION",
    "AggregateResult",
    "RunStore",
    "StoreError",
    "aggregate_run",
    "all_schemas",
    "join_run",
    "joined_frame",
    "summarize",
]

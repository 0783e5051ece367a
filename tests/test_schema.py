"""Every Parquet table against the checked-in snapshot: a change here is a deliberate decision."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from results.schema import (
    CACHE_ANSWER_SCHEMA,
    GENERATION_SCHEMA,
    HUMAN_CHOICE_SCHEMA,
    HUMAN_KEY_SCHEMA,
    METRIC_FIELDS,
    PLAN_SCHEMA,
    SCHEMA_VERSION,
    SUMMARY_SCHEMA,
    score_schema,
)

SNAPSHOT = Path(__file__).parent / "golden" / "schema_snapshot.json"


def all_schemas() -> dict[str, pa.Schema]:
    """Every table by name, for the snapshot test and `docs/design.md`."""
    tables = {"plan": PLAN_SCHEMA, "generations": GENERATION_SCHEMA}
    for metric in METRIC_FIELDS:
        tables[f"scores.{metric}"] = score_schema(metric)
    tables["summary"] = SUMMARY_SCHEMA
    tables["human.key"] = HUMAN_KEY_SCHEMA
    tables["human.choices"] = HUMAN_CHOICE_SCHEMA
    tables["cache.answers"] = CACHE_ANSWER_SCHEMA
    return tables


def describe(schema: pa.Schema) -> list[list[str]]:
    """[name, type] pairs: the snapshot's stable text form of a schema."""
    return [[f.name, str(f.type)] for f in schema]


def current() -> dict[str, object]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tables": {k: describe(v) for k, v in all_schemas().items()},
    }


def test_schema_matches_snapshot() -> None:
    # To accept a change: python -c "from tests.test_schema import current; import json;
    # print(json.dumps(current(), indent=1))" > tests/golden/schema_snapshot.json (and bump the version
    # if old run directories can no longer be read as they are).
    assert current() == json.loads(SNAPSHOT.read_text())

"""Every Parquet table against the checked-in snapshot: a change here is a deliberate decision."""

from __future__ import annotations

import json
from pathlib import Path

from results.schema import SCHEMA_VERSION, all_schemas, describe

SNAPSHOT = Path(__file__).parent / "golden" / "schema_snapshot.json"


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

"""`RUN/results.json`: what a run found in one file, in the shape lm-evaluation-harness users
know, written after every aggregation (its JSON Schema: docs/results.schema.json). The config is
redacted again here, so an old snapshot cannot leak a key.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

from jobs.redact import redact
from results.report.pieces import model_label, model_names
from results.run.store import RunStore

RESULTS_JSON = "results.json"
RESULTS_JSON_VERSION = 1

# Summary columns in results.json, in this order.
CELL_KEYS = (
    "model method variant task view metric stat group value ci_low ci_high ci_method p_value n "
    "n_boot resample_unit scorer scorer_version note mde flags"
).split()


def _name(row: dict[str, Any], names: dict[str, str]) -> dict[str, str]:
    return {"model_name": model_label(row["model"], names)} if row.get("model") else {}


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def results_document(store: RunStore) -> dict[str, Any]:
    """The results.json content of `store` (needs summary.parquet)."""
    from results.run.history import git_commit, harness_version, read_manifest
    from results.run.identity import read_config

    config = redact(read_config(store) or {})
    manifest = read_manifest(store)
    versions = {
        "lidao_harness": manifest.get("harness_version") or harness_version(),
        "git_commit": manifest.get("git_commit", git_commit()),
        "python": manifest.get("python"),
        "platform": manifest.get("platform"),
        "schema_version": manifest.get("schema_version"),
        "job_id_version": manifest.get("job_id_version"),
        "packages": manifest.get("packages") or {},
    }
    table = store.read_parquet("summary.parquet")
    present = [k for k in CELL_KEYS if k in table.column_names]
    missing = dict.fromkeys(k for k in CELL_KEYS if k not in present)  # an older summary's
    rows = table.select(present).to_pylist()
    names = model_names(config)
    return {
        "results_json_version": RESULTS_JSON_VERSION,
        "run": store.uri,
        "name": config.get("name"),
        "written": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "versions": versions,
        "aggregation": (config.get("aggregation") or {}),
        "results": [
            {**{k: _plain(v) for k, v in row.items()}, **missing, **_name(row, names)}
            for row in rows
        ],
    }


def write_results_json(store: RunStore) -> str | None:
    """Write RUN/results.json (atomic); None when the run has no summary yet."""
    if not store.exists("summary.parquet"):
        return None
    text = json.dumps(results_document(store), indent=1, allow_nan=False, default=str)
    return store.write_bytes(RESULTS_JSON, text.encode())

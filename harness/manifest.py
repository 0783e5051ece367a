"""`manifest.json`: provenance of a run (versions, host, timings, actor throughput)."""

from __future__ import annotations

import datetime as dt
import platform
import sys
from importlib import metadata
from typing import Any

from jobs.spec import JOB_ID_VERSION
from results.schema import SCHEMA_VERSION
from results.store import RunStore

PACKAGES = (
    "torch",
    "transformers",
    "ray",
    "pyarrow",
    "polars",
    "google-api-python-client",
    "vaderSentiment",
)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def update_manifest(store: RunStore, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` into the manifest (atomic rewrite). Never holds secrets."""
    manifest: dict[str, Any] = (
        store.read_json("manifest.json") if store.exists("manifest.json") else {}
    )
    manifest.setdefault("created", dt.datetime.now(dt.timezone.utc).isoformat())
    manifest.update(
        updated=dt.datetime.now(dt.timezone.utc).isoformat(),
        schema_version=SCHEMA_VERSION,
        job_id_version=JOB_ID_VERSION,
        python=sys.version.split()[0],
        platform=platform.platform(),
        packages=package_versions(),
    )
    manifest.update(updates)
    store.write_json("manifest.json", manifest)
    return manifest

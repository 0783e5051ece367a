"""`manifest.json`: a view of a run rebuilt from its history (`results.run.history`) and shards
at the end of every command, so a damaged or deleted manifest costs nothing (`read_manifest`
rebuilds it with a warning). `scoring` merges every scorer's latest stats over every
invocation, so scoring one scorer never drops another; `counts` are the rows on disk now, in
and out of the current plan.
"""

from __future__ import annotations

import datetime as dt
import logging
import platform
import sys
from typing import Any

from jobs.spec import JOB_ID_VERSION
from results.run.history import package_versions, read_history
from results.run.identity import plan_counts
from results.run.store import RunStore
from results.schema import SCHEMA_VERSION

log = logging.getLogger("harness")


def read_manifest(store: RunStore) -> dict[str, Any]:
    """The manifest; a missing one is {}, a damaged one is rebuilt (with a warning)."""
    if not store.exists("manifest.json"):
        return {}
    try:
        manifest = store.read_json("manifest.json")
        if isinstance(manifest, dict):
            return manifest
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    log.warning("%s/manifest.json is damaged: rebuilt from history.jsonl and the shards", store.uri)
    return rebuild_manifest(store)


def merge_scoring(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Per scorer: the new stats, unless the new invocation scored nothing and the old did."""
    out = dict(old)
    for name, stats in new.items():
        prev = out.get(name)
        if prev and not stats.get("scored") and prev.get("version") == stats.get("version"):
            out[name] = {**prev, "checked_again": stats.get("skipped")}
        else:
            out[name] = stats
    return out


def update_manifest(store: RunStore, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` into the manifest (atomic rewrite); `scoring` merges per scorer."""
    manifest = read_manifest(store)
    manifest.setdefault("created", dt.datetime.now(dt.timezone.utc).isoformat())
    manifest.update(_versions())
    if "scoring" in updates:
        scoring = merge_scoring(manifest.get("scoring") or {}, updates["scoring"])
        updates = {**updates, "scoring": scoring}
    manifest.update(updates)
    store.write_json("manifest.json", manifest)
    return manifest


def _versions() -> dict[str, Any]:
    return {
        "updated": dt.datetime.now(dt.timezone.utc).isoformat(),
        "schema_version": SCHEMA_VERSION,
        "job_id_version": JOB_ID_VERSION,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
    }


def rebuild_manifest(store: RunStore) -> dict[str, Any]:
    """Write manifest.json as derived from history and shards (nothing read from the old
    one); returns it."""
    records = read_history(store)
    view: dict[str, Any] = {"created": records[0]["started"] if records else None}
    view.update(_versions())
    last: dict[str, Any] = {}
    scoring: dict[str, Any] = {}
    view["replans"] = []
    for rec in records:
        brief = {k: rec.get(k) for k in ("started", "ended", "outcome", "argv", "config_hash")}
        last[rec.get("command", "?")] = brief
        for key in ("harness_version", "git_commit", "host"):
            if rec.get(key) is not None:
                view[key] = rec[key]
        stages = rec.get("stages") or {}
        gen = stages.get("generation")
        if gen and (gen.get("pending_at_start") or "generation" not in view):
            view["generation"] = gen
            view["timings"] = rec.get("timings", {})
        scoring = merge_scoring(scoring, stages.get("scoring") or {})
        if rec.get("replan"):
            view["replans"].append({"at": rec.get("started"), **rec["replan"]})
    view["invocations"] = {"count": len(records), "last": last}
    view["scoring"] = scoring
    try:  # rows on disk now, split by the current plan (foreign rows are never summed)
        view["counts"] = plan_counts(store)
    except (OSError, ValueError, RuntimeError) as exc:
        view["counts"] = {"error": str(exc)}
    store.write_json("manifest.json", view)
    return view

"""The run record (docs/design.md, "Record"): one JSON line per invocation in
`RUN/history.jsonl` (on object stores, which cannot append, one object per invocation under
`RUN/history/`), and `manifest.json`, a view of it rebuilt after every command, so a damaged or
deleted one costs nothing.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from jobs.redact import REDACTED, SECRET_KEYS, is_secret_key, redact_text
from jobs.spec import JOB_ID_VERSION
from results.run.identity import plan_counts
from results.run.store import RunStore
from results.schema import SCHEMA_VERSION

log = logging.getLogger("harness")

HISTORY_FILE = "history.jsonl"
HISTORY_DIR = "history"
PACKAGES = "torch transformers ray pyarrow polars google-api-python-client vaderSentiment".split()


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def harness_version() -> str:
    """The installed package's version, else the checkout's pyproject.toml's `(checkout)`."""
    found = _installed("lidao-harness")
    if found is None:
        try:
            text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
            match = re.search(r'^version = "([^"]+)"', text, re.M)
        except OSError:
            match = None
        found = f"{match.group(1)} (checkout)" if match else "unknown"
    return found


def package_versions() -> dict[str, str | None]:
    """Installed version of each of `PACKAGES` (None where it is not installed)."""
    return {name: _installed(name) for name in PACKAGES}


def git_commit() -> str | None:
    """HEAD of the checkout this code runs from (with `+dirty`), or None outside git."""
    root = str(Path(__file__).resolve().parents[1])

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=5)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "HEAD")
        dirty = head and git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with URL credentials (`jobs.redact.redact_text`) and the values of
    secret-looking `--set k=v` / `--flag v` replaced: a name holding a word of `SECRET_KEYS`
    anywhere (`--api-key-file`, `...params.apikey_path`), or whose last part is secret by
    `jobs.redact.is_secret_key` (`--set ...sig=v`)."""
    out: list[str] = []
    hide_next = False  # the value of a secret `--flag` given as the next argument
    for arg in argv:
        name, eq, _ = arg.partition("=")
        low = name.lower()
        secret = any(s in low for s in SECRET_KEYS) or is_secret_key(low.rsplit(".", 1)[-1])
        shown = redact_text(arg)
        out.append(REDACTED if hide_next else f"{name}={REDACTED}" if secret and eq else shown)
        hide_next = not hide_next and secret and not eq and arg.startswith("--")
    return out


def config_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()[:16]


@dataclass
class Invocation:
    """What one command did to a run directory; `append_record` writes it when it ends."""

    command: str
    argv: list[str] = field(default_factory=lambda: redact_argv(sys.argv[1:]))
    started: str = field(default_factory=now_iso)
    t0: float = field(default_factory=time.perf_counter)
    stages: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    config_hash: str | None = None

    def stage(self, name: str, stats: dict[str, Any], seconds: float) -> None:
        self.stages[name] = stats
        self.timings[f"{name}_s"] = round(seconds, 3)

    def record(self, outcome: str) -> dict[str, Any]:
        return {
            "command": self.command,
            "argv": self.argv,
            "started": self.started,
            "ended": now_iso(),
            "wall_s": round(time.perf_counter() - self.t0, 3),
            "outcome": outcome,
            "config_hash": self.config_hash,
            "harness_version": harness_version(),
            "git_commit": git_commit(),
            "python": sys.version.split()[0],
            "packages": package_versions(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "stages": self.stages,
            "timings": self.timings,
            **self.extra,
        }


def append_record(store: RunStore, record: dict[str, Any]) -> None:
    """Append one invocation's line (local) or object (object store)."""
    line = json.dumps(record, sort_keys=True, default=str, ensure_ascii=True) + "\n"
    if store.local:
        store.makedirs()
        fd = os.open(store.path(HISTORY_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    stamp = record["started"].replace(":", "").replace("-", "")
    store.write_bytes(f"{HISTORY_DIR}/{stamp}-{record['host']}-{record['pid']}.json", line.encode())


def read_history(store: RunStore) -> list[dict[str, Any]]:
    """Every invocation recorded, oldest first; a damaged line is skipped with a warning."""
    texts: list[tuple[str, str]] = []
    if store.exists(HISTORY_FILE):
        text = store.read_text(HISTORY_FILE)
        texts.extend((f"{HISTORY_FILE}:{i}", t) for i, t in enumerate(text.splitlines(), 1))
    if not store.local:
        for info in store.entries(HISTORY_DIR):
            if info.base_name.endswith(".json"):
                texts.append((info.path, store.read_text(f"{HISTORY_DIR}/{info.base_name}")))
    out = []
    for where, text in texts:
        if not text.strip():
            continue
        try:
            out.append(json.loads(text))
        except ValueError:
            log.warning("%s/%s: damaged history record skipped", store.uri, where)
    return sorted(out, key=lambda r: str(r.get("started", "")))


# ---- manifest.json: a view of the history and the shards -------------------------------------


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

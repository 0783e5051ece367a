"""The run record (docs/design.md, "Record"): one JSON line per invocation in
`RUN/history.jsonl`, appended, never rewritten; `manifest.json` is a view rebuilt from it.

Local run directories append with `O_APPEND` and one `write` of the whole line, then fsync: a
line is whole or absent. Object stores cannot append: each invocation is one object
`RUN/history/<start>-<host>-<pid>.json`; `read_history` reads both forms in start order.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from results.run.store import RunStore

log = logging.getLogger("harness")

HISTORY_FILE = "history.jsonl"
HISTORY_DIR = "history"
_SECRET_FLAGS = ("key", "token", "password", "secret")
PACKAGES = "torch transformers ray pyarrow polars google-api-python-client vaderSentiment".split()


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def harness_version() -> str:
    return _installed("lidao-harness") or "unknown"


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
    """The command line with values of secret-looking `--set k=v` / `--flag v` replaced."""
    out: list[str] = []
    hide_next = False  # the value of a secret `--flag` given as the next argument
    for arg in argv:
        name, eq, _ = arg.partition("=")
        secret = any(s in name.lower() for s in _SECRET_FLAGS)
        out.append("<redacted>" if hide_next else f"{name}=<redacted>" if secret and eq else arg)
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

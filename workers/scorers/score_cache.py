"""A persistent cache of API scores (sqlite), written batch by batch as answers arrive: one
transaction per `put_many`, safe to share between processes on one machine (not on a network
file system). Keys, columns and why the rowid orders answers by arrival (`rows_after`, which
`workers.scorers.cache_mirror` puts back as shards): docs/design.md, "Scoring".
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

_SCHEMA = """
CREATE TABLE IF NOT EXISTS scores (
    text_sha256 TEXT NOT NULL,
    attributes TEXT NOT NULL,
    languages TEXT NOT NULL,
    api_version TEXT NOT NULL,
    status TEXT NOT NULL,          -- ok | error (a final answer, e.g. HTTP 400)
    response TEXT,                 -- raw JSON answer when ok
    error TEXT,                    -- reason when error
    created_utc TEXT NOT NULL,     -- ISO 8601 date of the answer
    PRIMARY KEY (text_sha256, attributes, languages, api_version)
)
"""


COLUMNS = tuple(  # of the table, and of `results.schema.CACHE_ANSWER_SCHEMA`, in this order
    "text_sha256 attributes languages api_version status response error created_utc".split()
)


class CacheKey(NamedTuple):
    text_sha256: str
    attributes: str  # comma-joined, sorted
    languages: str  # comma-joined, as sent
    api_version: str


class CachedScore(NamedTuple):
    status: str  # ok | error
    response: dict[str, Any] | None
    error: str | None
    created_utc: str


Fill = Callable[[Sequence[CacheKey]], dict[CacheKey, CachedScore]]


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ScoreCache:
    """An sqlite file of final answers; `None` path keeps them in memory only (tests)."""

    def __init__(self, path: str | None, fill: Fill | None = None) -> None:
        self.path, self.fill = path, fill
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # autocommit (isolation_level=None): each put_many is committed on return. Ray may call an
        # actor from another thread than the one that built it, hence check_same_thread.
        self._db = sqlite3.connect(
            path or ":memory:", timeout=60.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute(_SCHEMA)

    def get_many(self, keys: Iterable[CacheKey]) -> dict[CacheKey, CachedScore]:
        """The answers held for `keys`; those not in the file are asked of `fill` (the run's
        stored answers, `cache_mirror.CacheMirror.fill`), when given."""
        out: dict[CacheKey, CachedScore] = {}
        keys = set(keys)
        for key in keys:
            row = self._db.execute(
                "SELECT status, response, error, created_utc FROM scores WHERE text_sha256 = ? "
                "AND attributes = ? AND languages = ? AND api_version = ?",
                tuple(key),
            ).fetchone()
            if row is not None:
                out[key] = CachedScore(row[0], json.loads(row[1]) if row[1] else None, *row[2:])
        missing = [k for k in keys if k not in out]
        if missing and self.fill is not None:
            out.update(self.fill(missing))
        return out

    def put_many(
        self, entries: Iterable[tuple[CacheKey, str, dict[str, Any] | None, str | None]]
    ) -> None:
        """Add final answers `(key, status, response, error)`, in one transaction."""
        created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.add_rows(
            (*key, status, json.dumps(response, sort_keys=True) if response else None, err, created)
            for key, status, response, err in entries
        )

    def add_rows(self, rows: Iterable[Sequence[Any]]) -> int:
        """Add stored rows (`COLUMNS` order) in one transaction; a key already held keeps its
        answer. Returns how many were new."""
        before = self._db.total_changes
        with self._db:  # commits, or rolls back on any exception
            self._db.execute("BEGIN")
            self._db.executemany(
                f"INSERT OR IGNORE INTO scores ({', '.join(COLUMNS)}) VALUES "
                f"({', '.join('?' * len(COLUMNS))})",
                rows,
            )
        return int(self._db.total_changes - before)

    def rows_after(self, mark: int, limit: int) -> tuple[list[tuple[Any, ...]], int]:
        """Up to `limit` rows added after rowid `mark` (`COLUMNS` order), and the new mark."""
        got = self._db.execute(
            f"SELECT rowid, {', '.join(COLUMNS)} FROM scores WHERE rowid > ? ORDER BY rowid "
            "LIMIT ?",
            (mark, limit),
        ).fetchall()
        return [tuple(r[1:]) for r in got], (got[-1][0] if got else mark)

    def count_after(self, mark: int) -> int:
        return int(
            self._db.execute("SELECT COUNT(*) FROM scores WHERE rowid > ?", (mark,)).fetchone()[0]
        )

    def last_rowid(self) -> int:
        return int(self._db.execute("SELECT COALESCE(MAX(rowid), 0) FROM scores").fetchone()[0])

    def close(self) -> None:
        self._db.close()

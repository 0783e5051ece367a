"""A persistent cache of API scores (sqlite), written answer by answer.

Keyed by (sha256 of the text, attributes, languages, API version); each entry keeps the date
and the raw response, so scores can be re-derived after the service is gone. Every `put` is
its own committed transaction: a crash loses at most the answer in flight, and a re-run asks
nothing twice. sqlite's file locking makes the file safe to share between processes on one
machine (not on a network file system).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable
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


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ScoreCache:
    """An sqlite file of final answers; `None` path keeps them in memory only (tests)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # autocommit (isolation_level=None): each put is durable on return. Ray may call an
        # actor from another thread than the one that built it, hence check_same_thread.
        self._db = sqlite3.connect(
            path or ":memory:", timeout=60.0, isolation_level=None, check_same_thread=False
        )
        self._db.execute(_SCHEMA)

    def get_many(self, keys: Iterable[CacheKey]) -> dict[CacheKey, CachedScore]:
        out: dict[CacheKey, CachedScore] = {}
        for key in set(keys):
            row = self._db.execute(
                "SELECT status, response, error, created_utc FROM scores WHERE text_sha256 = ? "
                "AND attributes = ? AND languages = ? AND api_version = ?",
                tuple(key),
            ).fetchone()
            if row is not None:
                status, response, error, created = row
                out[key] = CachedScore(
                    status, json.loads(response) if response else None, error, created
                )
        return out

    def put(
        self,
        key: CacheKey,
        status: str,
        response: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self._db.execute(
            "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *key,
                status,
                json.dumps(response, sort_keys=True) if response else None,
                error,
                created,
            ),
        )

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM scores").fetchone()[0])

    def close(self) -> None:
        self._db.close()

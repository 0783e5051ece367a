"""Score rows written by whoever scored them: checked one row per input row, held, and written
as atomic score shards of ~8k rows (`ScoreBuffer`), or one shard per chunk (`write_chunk`).

A `workers.actors.ScorerActor` holds its rows here and writes them itself; without Ray the
scoring stage (`harness.stages.scoring.stage`) does the same in the driver. `ScoringError` is the
scoring stage's error: a scorer whose rows do not match its input raises it here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from jobs.catalog import SCORER_METRICS
from results.run.store import RunStore
from workers.scorers.base import RETRY, Row

FLUSH_ROWS = 8192  # score rows a writer holds before it writes them as one shard
FLUSH_S = 60.0  # ... or once its oldest held row is this old (a slow, rate-limited scorer)
# Rows that are not scores and are never written: `missing` (not in a cache-only Perspective's
# cache) and `retry` (a transient failure): a later `score` hands them out again.
UNWRITTEN = ("missing", RETRY)


class ScoringError(RuntimeError):
    """Scorers that could not start or failed mid-way.

    `stats` holds what the scorers that did finish report (for the manifest).
    """

    def __init__(self, message: str, stats: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.stats = stats or {}


def check_rows(name: str, chunk: Sequence[Row], out: Sequence[Row]) -> None:
    """Raises `ScoringError` unless `out` holds one row per row of `chunk` (by job id)."""
    want = sorted(r["job_id"] for r in chunk)
    got = sorted(r["job_id"] for r in out)
    if want != got:
        lost = sorted(set(want) - set(got))[:3]
        raise ScoringError(
            f"scorer {name!r} returned {len(out)} rows for {len(chunk)} "
            f"(one per row expected; e.g. missing {lost})"
        )


def write_chunk(store: RunStore, name: str, chunk: Sequence[Row], out: Sequence[Row]) -> None:
    """Check the scorer's rows (`check_rows`) and write them as one atomic shard, but for the
    `UNWRITTEN` ones."""
    ScoreBuffer(store, name, flush_rows=1).add(chunk, out)


class ScoreBuffer:
    """Score rows held by their writer and written as one atomic shard once `flush_rows` rows
    are held or the oldest is `FLUSH_S` old. What is held is not yet a score: a writer that
    dies loses it, and `harness.stages.scoring.loop.ScoreLoop` requeues every chunk of an
    actor that it has not seen flushed."""

    def __init__(self, store: RunStore, name: str, flush_rows: int = FLUSH_ROWS) -> None:
        self.store, self.name, self.flush_rows = store, name, max(1, flush_rows)
        self.rows: list[Row] = []
        self.since = 0.0

    def add(self, chunk: Sequence[Row], out: Sequence[Row]) -> bool:
        """Check the scorer's rows (`check_rows`), hold them; True when this wrote a shard."""
        check_rows(self.name, chunk, out)
        kept = [r for r in out if r["status"] not in UNWRITTEN]
        if kept and not self.rows:
            self.since = time.monotonic()
        held = len(self.rows)
        self.rows.extend(kept)
        if len(self.rows) >= self.flush_rows or (
            self.rows and time.monotonic() - self.since >= FLUSH_S
        ):
            try:
                self.flush()
            except BaseException:
                del self.rows[held:]  # this chunk fails (and is retried); the rest stays held
                raise
            return True
        return False

    def flush(self) -> int:
        """Write what is held as one shard; returns how many rows. A failed write keeps them."""
        if self.rows:
            self.store.write_scores(self.name, SCORER_METRICS[self.name], self.rows)
        count, self.rows = len(self.rows), []
        return count

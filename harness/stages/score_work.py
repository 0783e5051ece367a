"""One scorer's share of the scoring stage (`Work`): where its rows come from (a feed of
`harness.stages.score_feed`), chunks to retry, what came back, and its stats.

A chunk that fails is retried up to `retries` times; after that its rows stay unscored, and
`GIVE_UP_IN_A_ROW` chunks given up one after the other stop the scorer (`ScoringError`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from harness.stages.score_feed import OkRows, input_columns, read_shard_columns, scored_ids
from jobs.catalog import SCORER_METRICS
from results.run.store import RunStore
from workers.scorers.base import RETRY
from workers.scorers.registry import load_scorer
from workers.scorers.score_buffer import Row, ScoreBuffer, ScoringError, check_rows, write_chunk

GIVE_UP_IN_A_ROW = 5  # chunks given up one after the other: the scorer stops


@dataclass
class Work:
    """One scorer's share of the stage: where its rows come from, what came back."""

    name: str
    version: str
    feed: OkRows
    total: int  # rows to score (for progress)
    skipped: int  # ok rows scored before this stage
    retries: int
    progress: Any = None
    retry: list[tuple[list[Row], int]] = field(default_factory=list)  # (chunk, attempts)
    failed_chunks: int = 0
    failed_rows: int = 0
    given_up_in_a_row: int = 0
    first_error: str | None = None
    statuses: Counter[str] = field(default_factory=Counter)
    retry_kinds: Counter[str] = field(default_factory=Counter)  # transient failures, by kind
    started: float = field(default_factory=time.perf_counter)
    buffer: ScoreBuffer | None = None  # without Ray: rows held here, written ~8k at a time

    def next_chunk(self) -> tuple[list[Row], int] | None:
        """A chunk to send (retries first) and its attempts so far; None when none is left."""
        if self.retry:
            return self.retry.pop(0)
        chunk = self.feed.next_chunk()
        return None if chunk is None else (chunk, 0)

    def write(
        self, store: RunStore, chunk: list[Row], out: list[Row], written: bool = False
    ) -> None:
        """Check that every input row came back exactly once, then write the shard (unless
        `written`: an actor wrote it and `out` holds only each row's job id and status)."""
        if written:
            check_rows(self.name, chunk, out)
        elif self.buffer is not None:
            self.buffer.add(chunk, out)
        else:
            write_chunk(store, self.name, chunk, out)
        self.given_up_in_a_row = 0
        self.statuses.update(r["status"] for r in out)
        retry = [str(r.get("error") or "").split(":")[0] for r in out if r["status"] == RETRY]
        self.retry_kinds.update(retry)
        if self.progress is not None:  # empty rows are not failures
            bad = len(retry) + sum(r["status"] == "error" for r in out)
            self.progress.update(len(out), ok=len(out) - bad)

    def chunk_failed(self, chunk: list[Row], attempts: int, error: str) -> None:
        """Retry the chunk, or give it up: its rows stay unscored, the scorer goes on.

        Raises `ScoringError` when `GIVE_UP_IN_A_ROW` chunks in a row were given up: the
        failure is the scorer's, not the chunks'.
        """
        if attempts < self.retries:
            self.retry.append((chunk, attempts + 1))
            return
        self.failed_chunks += 1
        self.failed_rows += len(chunk)
        self.first_error = self.first_error or error
        self.given_up_in_a_row += 1
        if self.given_up_in_a_row >= GIVE_UP_IN_A_ROW:
            raise ScoringError(f"{self.given_up_in_a_row} chunks in a row failed: {error}")

    def failure(self) -> str | None:
        problems = []
        if self.failed_chunks:
            problems.append(
                f"{self.failed_chunks} chunk(s) ({self.failed_rows} rows) failed "
                f"{self.retries + 1} times (first error: {self.first_error}); they stay "
                "unscored: run `score` again"
            )
        if self.feed.unreadable:
            problems.append(
                f"{len(self.feed.unreadable)} generation shard(s) unreadable "
                f"(e.g. {self.feed.unreadable[0]}); their rows stay unscored"
            )
        return "; ".join(problems) or None

    def stats(self, scorer_stats: Any) -> dict[str, Any]:
        if self.progress is not None:
            self.progress.close()
        return {
            "version": self.version,
            "scored": sum(self.statuses.values()),
            "skipped": self.skipped,
            "status": dict(self.statuses),
            "failed_chunks": self.failed_chunks,
            "retry_kinds": dict(self.retry_kinds),
            "elapsed_s": round(time.perf_counter() - self.started, 3),
            "scorer": scorer_stats,
        }


def new_work(
    store: RunStore,
    name: str,
    version: str,
    batch_size: int,
    progress: bool,
    retries: int,
) -> Work:
    """A scorer's `Work`: counts what is left (reading only job_id and status), opens the feed."""
    metric = SCORER_METRICS[name]
    skip = scored_ids(store, name, metric, version)
    # Rows of a replaced plan (`run --replan`) stay on disk but are never scored.
    planned = (
        store.read_plan(["job_id"])["job_id"].to_arrow() if store.exists("plan.parquet") else None
    )
    total = skipped = 0
    for path in store.list_shards("generations"):
        table = read_shard_columns(store, path, ["job_id", "status"])
        ok = pc.fill_null(pc.equal(table["status"], "ok"), False)
        if planned is not None:
            ok = pc.and_(ok, pc.is_in(table["job_id"], value_set=planned))
        done = pc.is_in(table["job_id"], value_set=skip)
        ok_done = pc.and_(ok, done)
        total += int(pc.sum(ok).as_py() or 0)
        skipped += int(pc.sum(ok_done).as_py() or 0)
    total -= skipped
    bar = None
    if progress and total:
        from harness.progress import Progress

        bar = Progress(f"score {name}", total=total)
    feed = OkRows(store, input_columns(load_scorer(name)), skip, batch_size, only=planned)
    return Work(name, version, feed, total, skipped, retries, bar)

"""What is scored: the ok generation rows a scorer has not scored at its version, streamed from
the generation shards (`OkRows`, also while generation still writes them), and one
scorer's share of the stage (`Work`): the chunks to retry, what came back, its stats.

The driver never holds the run's generation rows: one shard is read at a time, only the columns
scorers use; what is kept across shards is the job ids handed out (a job in two shards is
scored once). A chunk that fails is retried up to `retries` times, then its rows stay unscored;
`GIVE_UP_IN_A_ROW` chunks given up one after the other stop the scorer (`ScoringError`).
"""

from __future__ import annotations

import collections
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.catalog import SCORER_METRICS
from results.run.shards import check_version
from results.run.store import RunStore, StoreError
from workers.scorers.base import RETRY, ScorerError
from workers.scorers.cache_mirror import CacheMirror
from workers.scorers.registry import load_scorer
from workers.scorers.score_buffer import Row, ScoreBuffer, ScoringError, check_rows, write_chunk

log = logging.getLogger("harness")
GIVE_UP_IN_A_ROW = 5  # chunks given up one after the other: the scorer stops

# The generation columns a scorer sees (a scorer class may ask for more: `input_columns`).
SCORE_INPUT_COLUMNS = (
    "job_id",
    "prompt_id",
    "prompt_group",
    "prompt",
    "continuation",
    "model",
    "method",
    "task",
    "status",
)


def input_columns(scorer_cls: Any) -> list[str]:
    extra = [c for c in getattr(scorer_cls, "input_columns", ()) if c not in SCORE_INPUT_COLUMNS]
    return [*SCORE_INPUT_COLUMNS, *extra]


def check_has_generations(store: RunStore) -> None:
    """Raises `StoreError` when the run has no generation shard (scoring never generates)."""
    if not store.list_shards("generations"):
        raise StoreError(f"no generations in {store.uri}; run `python -m harness run` first")


def read_shard_columns(store: RunStore, path: str, columns: list[str]) -> pa.Table:
    """The `columns` of one shard that it has (older shards lack newer columns: null)."""
    with store.fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        check_version(path, pf.schema_arrow.metadata)
        present = [c for c in columns if c in pf.schema_arrow.names]
        table = pf.read(columns=present)
    for c in columns:
        if c not in present:
            table = table.append_column(c, pa.nulls(table.num_rows, pa.string()))
    return table.select(columns)


def scored_ids(store: RunStore, scorer: str, metric: str, version: str) -> pa.Array:
    """Job ids scored by `scorer` at `version` (its other versions do not count)."""
    done = store.read_scores(scorer, metric)
    ids = done.filter(done["scorer_version"] == version)["job_id"]
    return pa.array(ids.to_list(), pa.string())


class OkRows:
    """The ok generation rows not yet scored, as chunks of dicts, one shard read at a time.

    `skip`: job ids already scored; `only`: job ids of the current plan (None: every row).
    Counts: `rows` handed out, `unreadable` shards (their rows stay unscored; reported).

    `poll_s` set: a run whose generation is still going. `next_chunk` then returns the
    unscored ok rows of shards that appeared since the last look, or None when nothing new is
    there *yet*. The folder is listed at most every `poll_s` seconds (never more than a tenth
    of the time, when listing is slow), and again only once every listed shard is read. A
    shard is read once (by path), a job handed out once (by id). Shards are published
    atomically, so a poll never sees one half-written; one that disappears before its read
    (compacted into a `part-c-` shard) is skipped: the next poll lists the shard that holds
    its rows now (`vanished` counts them).
    """

    def __init__(
        self,
        store: RunStore,
        columns: list[str],
        skip: pa.Array,
        chunk_size: int,
        only: pa.Array | None = None,
        poll_s: float | None = None,
    ) -> None:
        self.store, self.columns, self.skip, self.only = store, columns, skip, only
        self.chunk_size, self.poll_s = max(1, chunk_size), poll_s
        self.seen: set[str] = set()
        self.rows = self.polls = self.vanished = 0
        self.unreadable: list[str] = []
        self.read_paths: set[str] = set()
        self._unread: collections.deque[str] = collections.deque()  # listed, not read yet
        self._pending: collections.deque[pa.Table] = collections.deque()  # rows to hand out
        self._due = 0.0  # time.monotonic() of the next poll

    def next_chunk(self) -> list[Row] | None:
        """Up to `chunk_size` rows (None: none left); shards are read one at a time as rows
        are needed (memory: about one shard)."""
        buf: list[Row] = []
        while len(buf) < self.chunk_size:
            if not self._pending:
                if not self._unread and time.monotonic() >= self._due:
                    self.poll()
                if not self._unread:
                    break
                table = self._read(self._unread.popleft())
                if table is not None and (fresh := self._fresh(table)).num_rows:
                    self._pending.append(fresh)
                continue
            table = self._pending.popleft()
            take = table.slice(0, self.chunk_size - len(buf))
            if take.num_rows < table.num_rows:
                self._pending.appendleft(table.slice(take.num_rows))
            for row in take.to_pylist():
                if row["job_id"] not in self.seen:  # the same job in two shards: once
                    self.seen.add(row["job_id"])
                    buf.append(row)
        if not buf:
            return None
        self.rows += len(buf)
        return buf

    def poll(self) -> int:
        """List the shards that appeared since the last poll; returns how many."""
        started = time.monotonic()
        listed = set(self._unread)
        new = [
            p
            for p in self.store.list_shards("generations")
            if p not in self.read_paths and p not in listed
        ]
        self._unread.extend(new)
        self.polls += 1
        wait = float("inf") if self.poll_s is None else self.poll_s  # None: one listing
        self._due = time.monotonic() + max(wait, 10 * (time.monotonic() - started))
        return len(new)

    def _fresh(self, table: pa.Table) -> pa.Table:
        """The ok rows of the current plan not scored before (`seen` is checked row by row)."""
        keep = pc.and_(
            pc.equal(table["status"], "ok"),
            pc.invert(pc.is_in(table["job_id"], value_set=self.skip)),
        )
        if self.only is not None:
            keep = pc.and_(keep, pc.is_in(table["job_id"], value_set=self.only))
        return table.filter(pc.fill_null(keep, False))

    def _read(self, path: str) -> pa.Table | None:
        try:
            table = read_shard_columns(self.store, path, self.columns)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad shard must not stop the scorer
            if self.poll_s is not None and self._gone(path):
                self.vanished += 1  # its rows are in a shard the next poll lists
                return None
            log.error("cannot read %s (%s): its rows stay unscored", path, exc)
            self.unreadable.append(path)
            table = None
        self.read_paths.add(path)
        return table

    def _gone(self, path: str) -> bool:
        return self.store.fs.get_file_info(path).type == pafs.FileType.NotFound


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

    def score_here(
        self,
        store: RunStore,
        scorer: Any,
        mirror: CacheMirror | None,
        chunk: list[Row],
        attempts: int,
    ) -> None:
        """Score and write one chunk in this process. Raises `ScorerError` (the scorer cannot
        work: no retry helps) and `chunk_failed`'s `ScoringError`."""
        try:
            self.write(store, chunk, scorer.score(chunk))
        except ScorerError:
            raise
        except Exception as exc:  # noqa: BLE001 - this chunk only; the scorer goes on
            self.chunk_failed(chunk, attempts, f"{type(exc).__name__}: {exc}")
        if mirror is not None:
            mirror.maybe_put()

    def chunk_failed(self, chunk: list[Row], attempts: int, error: str) -> None:
        """Retry the chunk, or give it up: its rows stay unscored, the scorer goes on.

        Raises `ScoringError` when `GIVE_UP_IN_A_ROW` chunks in a row were given up.
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

    def stats(self, **extra: Any) -> dict[str, Any]:
        """What this scorer did (the stage's stats; following: `Followed.stats`), and `extra`."""
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
            **extra,
        }


def new_work(
    store: RunStore,
    name: str,
    version: str,
    batch_size: int,
    progress: bool,
    retries: int,
    poll_s: float | None = None,
) -> Work:
    """A scorer's `Work`: counts what is left (reading only job_id and status), opens the feed.
    `poll_s`: over a generation still going (no total, no progress bar)."""
    skip = scored_ids(store, name, SCORER_METRICS[name], version)
    # Rows of a replaced plan (`run --replan`) stay on disk but are never scored.
    planned = (
        store.read_plan(["job_id"])["job_id"].to_arrow() if store.exists("plan.parquet") else None
    )
    columns = input_columns(load_scorer(name))
    if poll_s is not None:
        follow = OkRows(store, columns, skip, batch_size, only=planned, poll_s=poll_s)
        return Work(name, version, follow, 0, 0, retries)
    total = skipped = 0
    for path in store.list_shards("generations"):
        table = read_shard_columns(store, path, ["job_id", "status"])
        ok = pc.fill_null(pc.equal(table["status"], "ok"), False)
        if planned is not None:
            ok = pc.and_(ok, pc.is_in(table["job_id"], value_set=planned))
        total += int(pc.sum(ok).as_py() or 0)
        skipped += int(pc.sum(pc.and_(ok, pc.is_in(table["job_id"], value_set=skip))).as_py() or 0)
    total -= skipped
    bar = None
    if progress and total:
        from harness.progress import Progress

        bar = Progress(f"score {name}", total=total)
    feed = OkRows(store, columns, skip, batch_size, only=planned)
    return Work(name, version, feed, total, skipped, retries, bar)

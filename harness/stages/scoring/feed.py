"""What the scoring stage reads: generation rows streamed in chunks (the Perspective cache
mirrored into the run's storage is `workers.scorers.cache_mirror`).

The driver never holds the run's generation rows: `ok_chunks` reads one generation shard at a
time, only the columns scorers use, drops rows that are not ok or already scored, and turns
one chunk at a time into the dicts a scorer takes. What it keeps across shards is the job ids
it has handed out (to skip a job present in two shards), not the rows.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.run.shards import check_version
from results.run.store import RunStore, StoreError

log = logging.getLogger("harness")

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


class OkRows:
    """The ok generation rows not yet scored, as chunks of dicts, one shard read at a time.

    `skip` holds job ids already scored (a pyarrow array, from the score shards). Counts:
    `rows` handed out, `unreadable` shards that could not be read (their rows stay unscored;
    the stage reports them).
    """

    def __init__(
        self,
        store: RunStore,
        columns: list[str],
        skip: pa.Array,
        chunk_size: int,
        only: pa.Array | None = None,
    ) -> None:
        self.store, self.columns, self.skip = store, columns, skip
        self.only = only  # job ids of the current plan (None: every row)
        self.chunk_size = max(1, chunk_size)
        self.seen: set[str] = set()
        self.rows = 0
        self.unreadable: list[str] = []
        self._chunks = self._iter()

    def next_chunk(self) -> list[dict[str, Any]] | None:
        return next(self._chunks, None)

    def _iter(self) -> Iterator[list[dict[str, Any]]]:
        buf: list[dict[str, Any]] = []
        for path in self.store.list_shards("generations"):
            table = self._read(path)
            if table is None:
                continue
            for batch in self._fresh(table).to_batches(max_chunksize=self.chunk_size):
                for row in batch.to_pylist():
                    if row["job_id"] in self.seen:
                        continue  # the same job in two shards: score it once
                    self.seen.add(row["job_id"])
                    buf.append(row)
                    if len(buf) == self.chunk_size:
                        self.rows += len(buf)
                        yield buf
                        buf = []
        if buf:
            self.rows += len(buf)
            yield buf

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
            return read_shard_columns(self.store, path, self.columns)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - one bad shard must not stop the scorer
            log.error("cannot read %s (%s): its rows stay unscored", path, exc)
            self.unreadable.append(path)
            return None


class FollowRows(OkRows):
    """`OkRows` of a run whose generation is still going: `next_chunk` returns the unscored ok
    rows of shards that appeared since the last look, or None when nothing new is there *yet*.

    The generation folder is listed at most every `poll_s` seconds (more seldom when listing
    itself is slow: never more than a tenth of the time). Exactly once: a shard is read once
    (by path) and a job handed out once (by id), whatever the polls see. Shards are published
    atomically (a temp name then a rename, or one put), so a poll never sees one half-written.
    A shard that disappears between the listing and the read (a compaction moved its rows
    into a `part-c-` shard) is skipped: the next poll lists the shard that holds them now.
    """

    def __init__(
        self,
        store: RunStore,
        columns: list[str],
        skip: pa.Array,
        chunk_size: int,
        only: pa.Array | None = None,
        poll_s: float = 5.0,
    ) -> None:
        super().__init__(store, columns, skip, chunk_size, only)
        self.poll_s = poll_s
        self.read_paths: set[str] = set()
        self.polls = 0
        self.vanished = 0  # shards gone between a listing and their read
        self._unread: collections.deque[str] = collections.deque()  # listed, not read yet
        self._pending: collections.deque[pa.Table] = collections.deque()  # rows to hand out
        self._due = 0.0  # time.monotonic() of the next poll

    def next_chunk(self) -> list[dict[str, Any]] | None:
        """Up to `chunk_size` rows; shards are read one at a time as rows are needed, and the
        folder listed again only once every listed shard is read (memory: about one shard)."""
        buf: list[dict[str, Any]] = []
        while len(buf) < self.chunk_size:
            if not self._pending:
                if not self._unread and time.monotonic() >= self._due:
                    self.poll()
                if not self._unread:
                    break
                self._read_next()
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
        self._due = time.monotonic() + max(self.poll_s, 10 * (time.monotonic() - started))
        return len(new)

    def _read_next(self) -> None:
        table = self._read_published(self._unread.popleft())
        if table is not None:
            fresh = self._fresh(table)
            if fresh.num_rows:
                self._pending.append(fresh)

    def _read_published(self, path: str) -> pa.Table | None:
        try:
            table = read_shard_columns(self.store, path, self.columns)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - gone (compacted) or unreadable
            if self.store.fs.get_file_info(path).type == pafs.FileType.NotFound:
                self.vanished += 1  # its rows are in a shard the next poll lists
                return None
            self.read_paths.add(path)
            log.error("cannot read %s (%s): its rows stay unscored", path, exc)
            self.unreadable.append(path)
            return None
        self.read_paths.add(path)
        return table


def scored_ids(store: RunStore, scorer: str, metric: str, version: str) -> pa.Array:
    """Job ids scored by `scorer` at `version` (its other versions do not count)."""
    done = store.read_scores(scorer, metric)
    ids = done.filter(done["scorer_version"] == version)["job_id"]
    return pa.array(ids.to_list(), pa.string())

"""The run directory: atomic Parquet shards, the plan, the manifest.

Layout (see docs/design.md)::

    RUN/config.yaml  manifest.json  plan.parquet
    RUN/generations/part-<hash>.parquet          one finished batch (written by its actor)
    RUN/generations/part-<hash>-failed.parquet   error rows the driver wrote for a failed batch
    RUN/generations/part-c-<hash>.parquet        compacted: many batches, sorted by slice
    RUN/scores/<scorer>/part-<hash>.parquet
    RUN/quarantine/<stage>/...                   unreadable shards, moved aside (jobs pending)
    RUN/summary.parquet  summary.csv  report/

A shard is complete or absent: local files go to a temp file in the same folder, are fsynced and
renamed (`os.replace`); object stores (s3://, gs://) get one put of bytes built in memory, and a
streamed object (the plan) goes to a temp key that is copied into place only once it is whole.
Shard names hash the job ids they hold, so a retried batch rewrites the same file; the driver's
error shards carry `-failed`, so a late write of the batch by a zombie actor never collides with
them. Reads go through `pyarrow.dataset` (parallel, only the columns asked for) and deduplicate by
job id, so a row present in two shards (a compaction killed half-way) counts once.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.spec import JobSpec, plan_columns
from results.run import shards as shard_io
from results.run.done import DoneIds
from results.run.shards import (
    ShardReader,
    StoreError,
    atomic_output,
    open_filesystem,
    put_bytes,
)
from results.schema import GENERATION_SCHEMA, PLAN_SCHEMA, SCHEMA_VERSION, score_schema

__all__ = ["DoneIds", "RunStore", "StoreError", "shard_name"]

log = logging.getLogger("harness")
COMPACT_TARGET_ROWS = 50_000  # rows per compacted shard (~5-20 MB of generations)


def shard_name(job_ids: Iterable[str], kind: str = "") -> str:
    """`part-<hash of the sorted ids>[-kind].parquet`."""
    digest = hashlib.sha256("\n".join(sorted(job_ids)).encode()).hexdigest()[:24]
    return f"part-{digest}{'-' + kind if kind else ''}.parquet"


class RunStore:
    """A run directory on the local disk or on a pyarrow filesystem (URI)."""

    def __init__(self, root: str) -> None:
        self.uri = root
        if "://" in root:
            self.fs, self.root = open_filesystem(root)
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
            self.local = True
        self.reader = ShardReader(self.fs, self.root, self.uri, reopen=self._reopen)

    def _reopen(self) -> pafs.FileSystem:
        """A new filesystem client for this run (fresh connections: the damage probe)."""
        return open_filesystem(self.uri)[0] if "://" in self.uri else pafs.LocalFileSystem()

    # ---- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def exists(self, *parts: str) -> bool:
        info = self.fs.get_file_info(self.path(*parts))
        return info.type != pafs.FileType.NotFound

    def delete(self, path: str) -> None:
        """Remove one file (a full path, as `list_shards` gives)."""
        self.fs.delete_file(path)

    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def list_shards(self, *parts: str) -> list[str]:
        return [i.path for i in self.reader.listing(parts)]

    @property
    def quarantined(self) -> list[str]:
        """Shards this store moved aside as unreadable (full paths under RUN/quarantine/)."""
        return list(self.reader.quarantined)

    def quarantine_files(self) -> list[str]:
        """Every file under RUN/quarantine/ (also those moved by earlier runs)."""
        sel = pafs.FileSelector(self.path("quarantine"), allow_not_found=True, recursive=True)
        return sorted(i.path for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File)

    # ---- atomic writes -------------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> str:
        """Write `data` to RUN/rel atomically; returns the full path."""
        return put_bytes(self.fs, self.path(rel), data, self.local)

    def open_atomic(self, rel: str) -> Any:
        """Context manager: a stream that lands at RUN/rel only if the block ends normally."""
        return atomic_output(self.fs, self.path(rel), self.local)

    def write_table(self, rel: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(_stamped(table), buf, compression="zstd")
        return self.write_bytes(rel, buf.getvalue())

    def write_json(self, rel: str, obj: Any) -> str:
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)
        return self.write_bytes(rel, text.encode())

    def read_json(self, rel: str) -> Any:
        with self.fs.open_input_stream(self.path(rel)) as fh:
            return json.loads(fh.read().decode())

    def read_text(self, rel: str) -> str:
        with self.fs.open_input_stream(self.path(rel)) as fh:
            return str(fh.read().decode())

    # ---- the plan ------------------------------------------------------------------------
    def write_plan(self, rows: Sequence[dict[str, Any]]) -> str:
        return self.write_table("plan.parquet", pa.Table.from_pylist(list(rows), PLAN_SCHEMA))

    def clean_temp(self) -> list[str]:
        """Delete the temp files a killed writer left in RUN/ (`.tmp-…-plan.parquet`: a kill
        between closing the temp object and copying it into place); returns their paths.

        Only RUN/ itself: the driver writes there, under the run's lock, so no live writer
        owns them (actors write shards in the stage folders, never here).
        """
        sel = pafs.FileSelector(self.root, allow_not_found=True)
        stale = [
            i.path
            for i in self.fs.get_file_info(sel)
            if i.type == pafs.FileType.File and i.base_name.startswith(".tmp-")
        ]
        for path in stale:
            self.fs.delete_file(path)
            log.info("removed %s (a temp file left by a killed writer)", path)
        return stale

    def write_plan_tables(self, tables: Iterable[pa.Table]) -> int:
        """Stream tables of PLAN_SCHEMA into plan.parquet (one row group each); returns rows.

        Memory stays at one table; the file appears only once every table is written. Temp
        files an earlier, killed writer left in RUN/ are removed first (`clean_temp`).
        """
        self.clean_temp()
        rows = 0
        schema = _stamped(PLAN_SCHEMA.empty_table()).schema
        with self.open_atomic("plan.parquet") as out:
            with pq.ParquetWriter(out, schema, compression="zstd") as writer:
                for table in tables:
                    writer.write_table(table.cast(schema))
                    rows += table.num_rows
        return rows

    def write_plan_jobs(self, chunks: Iterable[Sequence[JobSpec]]) -> int:
        """Stream chunks of `JobSpec`s (e.g. `jobs.iter_plan` chunks' jobs) into plan.parquet."""
        return self.write_plan_tables(
            pa.table(plan_columns(jobs), schema=PLAN_SCHEMA) for jobs in chunks
        )

    def read_plan(self, columns: list[str] | None = None) -> pl.DataFrame:
        if not self.exists("plan.parquet"):
            raise StoreError(f"{self.uri}: no plan.parquet (not a run directory?)")
        return _frame(self.reader.read_file(self.path("plan.parquet"), columns))

    def iter_plan(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """plan.parquet a row group (a planned chunk) at a time: memory of one chunk.

        A transport fault reopens the file and goes on at the row group that failed
        (`retry_io`'s attempts and waits, counted over the whole pass)."""
        path, done, failures = self.path("plan.parquet"), 0, 0
        delay = shard_io.RETRY_BACKOFF_S
        while True:
            try:
                with self.fs.open_input_file(path) as fh:
                    plan = pq.ParquetFile(fh)
                    while done < plan.num_row_groups:
                        table = plan.read_row_group(done, columns=columns)
                        done += 1
                        yield table
                return
            except OSError as exc:
                failures += 1
                if failures >= shard_io.READ_TRIES:
                    raise StoreError(f"{path}: reading failed {failures} times: {exc}") from exc
                log.warning("%s: read failed (%s); trying again in %.1fs", path, exc, delay)
                time.sleep(delay)
                delay *= 2

    # ---- generations ---------------------------------------------------------------------
    def write_generations(self, rows: Sequence[dict[str, Any]], kind: str = "") -> str:
        """One atomic shard of generation rows (a finished batch)."""
        table = pa.Table.from_pylist(list(rows), GENERATION_SCHEMA)
        return self.write_table(
            "generations/" + shard_name((r["job_id"] for r in rows), kind), table
        )

    def write_failed(self, rows: Sequence[dict[str, Any]]) -> int:
        """Error rows of a batch that failed every retry, except for jobs that already have an
        ok row (an attempt wrote them before failing, e.g. halves of an out-of-memory split).

        Written as `part-<hash>-failed.parquet`: never the name of the batch's own ok shard.
        Returns how many rows were written.
        """
        ok = self.reader.ids_with_status(
            ("generations",), GENERATION_SCHEMA, [r["job_id"] for r in rows], "ok"
        )
        left = [r for r in rows if r["job_id"] not in ok]
        if left:
            self.write_generations(left, kind="failed")
        return len(left)

    def read_generations(self, columns: list[str] | None = None) -> pl.DataFrame:
        """Every generation row, one per job id (an ok row wins over an error row)."""
        want = list(columns or GENERATION_SCHEMA.names)
        cols = want + [c for c in ("job_id", "status") if c not in want]
        table = self.reader.scan(("generations",), GENERATION_SCHEMA, cols)
        frame = _frame(_dedupe_generations(table)).select(want)
        return frame

    def iter_generations(
        self, columns: list[str] | None = None, batch_rows: int = 10_000
    ) -> Iterator[pl.DataFrame]:
        """`read_generations` in frames of at most `batch_rows` rows (a streaming scorer's input).

        Memory: one batch, plus the finished ids (`finished_ids`) that tell whether any job has
        two rows on disk; only then (a retried failure, a compaction killed half-way) is the
        whole table read and deduplicated first.
        """
        ok, failed = self.finished_ids()
        rows = self.reader.count_rows(("generations",), GENERATION_SCHEMA)
        if rows != len(ok) + len(failed):  # some job has two rows
            frame = self.read_generations(columns)
            for start in range(0, frame.height, batch_rows):
                yield frame.slice(start, batch_rows)
            return
        want = list(columns or GENERATION_SCHEMA.names)
        for batch in self.reader.iter_batches(
            ("generations",), GENERATION_SCHEMA, want, batch_rows
        ):
            yield _frame(pa.Table.from_batches([batch]))

    def done_ids(self, include_errors: bool = True) -> DoneIds:
        """Ids of jobs with a row (only ok rows unless `include_errors`), compact and sorted."""
        ok, failed = self.finished_ids()
        if not include_errors:
            return ok
        return DoneIds(np.union1d(ok.ids, failed.ids)) if len(failed) else ok

    def finished_ids(self) -> tuple[DoneIds, DoneIds]:
        """(ids with an ok row, ids with only error rows): one streamed scan of job_id/status,
        holding ~23 bytes a finished job and one record batch.

        A failed read is tried again (`ShardReader.retrying`): shards damaged as stored are
        quarantined first; a transient fault waits and reads again; nothing healthy is moved.
        """

        def read() -> tuple[DoneIds, DoneIds]:
            ok_parts, bad_parts = [], []
            for batch in self.reader.iter_batches(
                ("generations",), GENERATION_SCHEMA, ["job_id", "status"], 65_536
            ):
                is_ok = pc.fill_null(pc.equal(batch.column("status"), "ok"), False)
                # as fixed-width NumPy right away: the Arrow batch is freed at once
                ok_parts.append(DoneIds.from_arrays([batch.column("job_id").filter(is_ok)]).ids)
                bad = batch.column("job_id").filter(pc.invert(is_ok))
                bad_parts.append(DoneIds.from_arrays([bad]).ids)
            ok = DoneIds.merge(ok_parts)
            return ok, DoneIds.merge(bad_parts).minus(ok)

        return self.reader.retrying(read, parts=("generations",))

    def done_job_ids(self, include_errors: bool = True) -> set[str]:
        return set(self.done_ids(include_errors).to_list())

    def generation_counts(self, finished: tuple[DoneIds, DoneIds] | None = None) -> pl.DataFrame:
        """Per (model, method, task) of the plan: planned, done (ok), failed, pending.

        Streams the plan a row group at a time against the done ids (`status`'s table);
        `finished`: `finished_ids()` when the caller has it already.
        """
        if not self.exists("plan.parquet"):
            raise StoreError(f"{self.uri}: no plan.parquet (not a run directory?)")
        ok, failed = finished or self.finished_ids()
        parts = []
        slice_cols = ["model", "method", "task"]
        for chunk in self.iter_plan(columns=["job_id", *slice_cols]):
            ids = chunk["job_id"].combine_chunks()
            frame = _frame(chunk.select(slice_cols)).with_columns(
                pl.Series("done", ok.contains(ids)), pl.Series("failed", failed.contains(ids))
            )
            parts.append(
                frame.group_by(slice_cols, maintain_order=True).agg(
                    pl.len().alias("planned"), pl.col("done").sum(), pl.col("failed").sum()
                )
            )
        empty = pl.DataFrame(
            schema={c: pl.String for c in slice_cols}
            | {"planned": pl.UInt32, "done": pl.UInt32, "failed": pl.UInt32}
        )
        table = pl.concat(parts) if parts else empty
        return (
            table.group_by(slice_cols, maintain_order=True)
            .agg(pl.col("planned", "done", "failed").sum())
            .with_columns((pl.col("planned") - pl.col("done") - pl.col("failed")).alias("pending"))
        )

    def compact_generations(self, target_rows: int = COMPACT_TARGET_ROWS) -> int:
        """Merge small generation shards into `part-c-` shards of about `target_rows` rows.

        Inputs: every shard not already compacted (so at most one short `part-c-` shard per
        compaction stays short), streamed in shard order and cut into groups of `target_rows`
        rows, so memory is one group whatever the run's size. Each output holds one row per job
        of its group, sorted by (model, method, task, job id) so that a slice lives in few row
        groups; an error row is dropped where the job has an ok row anywhere. New shards are
        written first, then the inputs deleted: a kill in between leaves rows twice on disk,
        which every read deduplicates, and the next compaction merges them again. Returns how
        many shards were merged.
        """
        merged, written = self._merge_small(
            ("generations",),
            lambda inputs, written: self._compact([i.path for i in inputs], target_rows, written),
        )
        if merged:
            log.info("compacted %d generation shards of %s into %d", merged, self.uri, len(written))
        return merged

    def _merge_small(
        self, parts: tuple[str, ...], merge: Callable[[list[Any], list[str]], None]
    ) -> tuple[int, list[str]]:
        """The compaction of one folder: its shards not yet compacted are merged by
        `merge(inputs, written)` (which appends each shard it writes to `written`), retried
        from a clean slate on transient faults (a failed attempt's outputs deleted first),
        then the inputs deleted. A folder with fewer than two such shards is left alone.
        Returns (inputs merged, shards written)."""
        small = [i for i in self.reader.listing(parts) if not i.base_name.startswith("part-c-")]
        if len(small) < 2:
            return 0, []
        written: list[str] = []

        def attempt() -> None:
            with ThreadPoolExecutor(8) as pool:  # a failed attempt's outputs: start again
                list(pool.map(self.delete, written))
            written.clear()
            existing = {i.path for i in self.reader.listing(parts)}
            merge([i for i in small if i.path in existing], written)

        try:  # transient faults wait and retry; damaged shards are quarantined on the way
            self.reader.retrying(attempt, parts=parts)
        except StoreError:
            with ThreadPoolExecutor(8) as pool:  # leave only whole inputs behind
                list(pool.map(self.delete, written))
            raise
        existing = {i.path for i in self.reader.listing(parts)}  # not those quarantined
        done = set(written)
        inputs = [i.path for i in small if i.path in existing and i.path not in done]
        with ThreadPoolExecutor(8) as pool:  # one request each on object stores
            list(pool.map(self.delete, inputs))
        self.reader.forget(parts)
        return len(inputs), written

    def _compact(self, small: list[str], target_rows: int, written: list[str]) -> None:
        """Write the rows of `small` as compacted shards, a group of `target_rows` at a time;
        each path written is appended to `written` at once (a failure deletes them)."""
        both = self._failed_with_ok(small)
        group: list[pa.RecordBatch] = []
        rows = 0

        def flush() -> None:
            table = pa.Table.from_batches(group, GENERATION_SCHEMA)
            if len(both):  # an error row whose job has an ok row (in another group) goes
                is_ok = pc.fill_null(pc.equal(table["status"], "ok"), False)
                ids = table["job_id"].combine_chunks()
                keep = pc.or_(is_ok, pa.array(~both.contains(ids)))
                if not pc.all(keep).as_py():
                    table = table.filter(keep)
            table = _dedupe_generations(table).sort_by(
                [(c, "ascending") for c in ("model", "method", "task", "job_id")]
            )
            if table.num_rows:
                name = "part-c-" + shard_name(table["job_id"].to_pylist())[len("part-") :]
                written.append(self.write_table("generations/" + name, table))

        for batch in self.reader.iter_batches(
            ("generations",), GENERATION_SCHEMA, None, 8192, only=small
        ):
            group.append(batch)
            rows += batch.num_rows
            if rows >= target_rows:
                flush()
                group, rows = [], 0
        if group:
            flush()

    def _failed_with_ok(self, paths: list[str]) -> DoneIds:
        """Ids with an error row *and* an ok row among `paths`: two streamed scans of
        job_id/status, holding only ids of error rows (few, in a healthy run)."""
        cols = ["job_id", "status"]
        bad_parts: list[pa.Array] = []
        for batch in self.reader.iter_batches(
            ("generations",), GENERATION_SCHEMA, cols, 65_536, only=paths
        ):
            is_ok = pc.fill_null(pc.equal(batch.column("status"), "ok"), False)
            bad_parts.append(batch.column("job_id").filter(pc.invert(is_ok)))
        bad = DoneIds.from_arrays(bad_parts)
        if not len(bad):
            return bad
        ok_parts: list[pa.Array] = []
        for batch in self.reader.iter_batches(
            ("generations",), GENERATION_SCHEMA, cols, 65_536, only=paths
        ):
            is_ok = pc.fill_null(pc.equal(batch.column("status"), "ok"), False)
            ids = batch.column("job_id").filter(is_ok)
            ok_parts.append(ids.filter(pa.array(bad.contains(ids))))
        return DoneIds.from_arrays(ok_parts)

    # ---- scores --------------------------------------------------------------------------
    def write_scores(self, scorer: str, metric: str, rows: Sequence[dict[str, Any]]) -> str:
        """One atomic shard of score rows; its name hashes job ids *and* scorer versions, so a
        retried chunk rewrites its own file while a rescoring at a new version never
        overwrites the rows of the old one."""
        table = pa.Table.from_pylist(list(rows), score_schema(metric))
        keys = (f"{r['job_id']}\x00{r['scorer_version']}" for r in rows)
        return self.write_table(f"scores/{scorer}/" + shard_name(keys), table)

    def compact_scores(
        self, scorer: str, metric: str, target_rows: int = COMPACT_TARGET_ROWS
    ) -> int:
        """Merge a scorer's chunk shards into `part-c-` shards of about `target_rows` rows, as
        `compact_generations` does for generations; returns how many shards were merged.

        A compacted shard holds one scorer version, one row per job id (the last in shard
        order), sorted by job id; its footer records the newest modification time of the
        chunk shards its version came from (`lidao_versions`), so that "the newest version"
        (`score_versions`) means the same before and after. New shards are written first,
        then the inputs deleted: a kill in between leaves rows twice, which reads deduplicate
        by (job id, version). Chunk shards written after the listing are left for the next
        compaction.
        """
        merged, written = self._merge_small(
            ("scores", scorer),
            lambda inputs, written: self._compact_scores(
                scorer, score_schema(metric), inputs, target_rows, written
            ),
        )
        if merged:
            log.info(
                "compacted %d %s score shards of %s into %d", merged, scorer, self.uri, len(written)
            )
        return merged

    def _compact_scores(
        self,
        scorer: str,
        schema: pa.Schema,
        small: list[pafs.FileInfo],
        target_rows: int,
        written: list[str],
    ) -> None:
        """Write the rows of `small` as compacted shards (`compact_scores`); each path written
        is appended to `written` at once."""
        groups: dict[str, list[pa.Table]] = {}
        rows: dict[str, int] = {}
        stamps: dict[str, float] = {}

        def flush(version: str) -> None:
            table = pa.concat_tables(groups.pop(version))
            rows.pop(version)
            frame = _frame(table).unique("job_id", keep="last", maintain_order=True)
            table = frame.to_arrow().cast(schema).sort_by("job_id")
            keys = (f"{j}\x00{version}" for j in table["job_id"].to_pylist())
            name = "part-c-" + shard_name(keys)[len("part-") :]
            meta = {b"lidao_versions": json.dumps({version: stamps[version]}).encode()}
            written.append(
                self.write_table(f"scores/{scorer}/{name}", table.replace_schema_metadata(meta))
            )

        mtimes = {i.path: _stamp(i) for i in small}
        for path, table, _ in self.reader.read_shards([i.path for i in small], schema):
            for version in pc.unique(table["scorer_version"]).drop_null().to_pylist():
                part = table.filter(pc.equal(table["scorer_version"], version))
                groups.setdefault(version, []).append(part)
                rows[version] = rows.get(version, 0) + part.num_rows
                stamps[version] = max(stamps.get(version, 0.0), mtimes[path])
                if rows[version] >= target_rows:
                    flush(version)
        for version in list(groups):
            flush(version)

    def score_versions(self, scorer: str) -> dict[str, float]:
        """Scorer version → when its newest rows were written (unix seconds): a chunk shard's
        modification time, or what a compacted shard's footer recorded for its inputs.

        One listing; a compacted shard costs one read of its footer, a chunk shard one read
        of its `scorer_version` column (few requests after compaction).
        """
        newest: dict[str, float] = {}
        key = pa.schema([("scorer_version", pa.string())])

        def read() -> None:
            newest.clear()
            infos = self.reader.listing(("scores", scorer))  # again after a quarantine
            stamps = {i.path: _stamp(i) for i in infos}
            compacted = [i.path for i in infos if i.base_name.startswith("part-c-")]
            chunks = [i.path for i in infos if not i.base_name.startswith("part-c-")]
            found: list[tuple[str, float]] = []
            for path, _table, meta in self.reader.read_shards(compacted, key, columns=[]):
                recorded = meta.get(b"lidao_versions")
                if recorded:
                    found += [(str(k), float(v)) for k, v in json.loads(recorded).items()]
                else:  # compacted by hand or an older version: read its versions
                    chunks.append(path)
            for path, table, _ in self.reader.read_shards(chunks, key):
                versions = pc.unique(table["scorer_version"]).drop_null().to_pylist()
                found += [(str(v), stamps[path]) for v in versions]
            for version, stamp in found:
                newest[version] = max(stamp, newest.get(version, float("-inf")))

        self.reader.retrying(read, parts=("scores", scorer))
        return newest

    def shard_mtimes(self, *parts: str) -> list[float]:
        """Modification times (unix seconds) of the shards in RUN/<parts>: one listing."""
        return [_stamp(i) for i in self.reader.listing(parts) if i.mtime is not None]

    def scorers(self) -> list[str]:
        sel = pafs.FileSelector(self.path("scores"), allow_not_found=True)
        return sorted(
            i.base_name for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.Directory
        )

    def read_scores(
        self, scorer: str, metric: str, columns: list[str] | None = None
    ) -> pl.DataFrame:
        """Score rows of one scorer, one per (job id, scorer version), newest shard wins."""
        want = list(columns or score_schema(metric).names)
        cols = want + [c for c in ("job_id", "scorer_version") if c not in want]
        frame = _frame(self.reader.scan(("scores", scorer), score_schema(metric), cols))
        if frame.is_empty():
            return frame.select(want)
        return frame.unique(["job_id", "scorer_version"], keep="last", maintain_order=True).select(
            want
        )


def _stamp(info: pafs.FileInfo) -> float:
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def _stamped(table: pa.Table) -> pa.Table:
    meta = dict(table.schema.metadata or {})
    meta[b"lidao_schema_version"] = str(SCHEMA_VERSION).encode()
    return table.replace_schema_metadata(meta)


def _dedupe_generations(table: pa.Table) -> pa.Table:
    """One row per job id: an ok row before an error row, else the first in shard order."""
    if table.num_rows == 0 or pc.count_distinct(table["job_id"]).as_py() == table.num_rows:
        return table
    keyed = pa.table(
        {
            "job_id": table["job_id"],
            "bad": pc.fill_null(pc.not_equal(table["status"], "ok"), True),
            "i": pa.array(range(table.num_rows), pa.int64()),
        }
    )
    first = (
        _frame(keyed)
        .sort(["job_id", "bad", "i"])
        .unique("job_id", keep="first", maintain_order=True)
        .sort("i")
    )
    return table.take(first["i"].to_arrow())


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame

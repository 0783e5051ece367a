"""`RunStore`: the run directory's plan, generation shards and score shards (layout and
guarantees: docs/design.md, "Run directory"). Reads keep one row per job id (generations: an ok
row wins over an error row; scores: per scorer version, the newest shard's), so a row in two
shards (a compaction killed half-way) counts once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.spec import JobSpec, plan_columns
from results.run import shards as shard_io
from results.run.compaction import Compaction, dedupe_generations
from results.run.done import DoneIds
from results.run.files import file_mtime, shard_name, to_frame, with_schema_version
from results.run.shards import StoreError
from results.schema import GENERATION_SCHEMA, PLAN_SCHEMA, score_schema

__all__ = ["DoneIds", "RunStore", "StoreError", "shard_name"]
log = logging.getLogger("harness")
PLAN_FIELDS_KEY = (
    b"lidao_plan_fields"  # plan.parquet footer: the config fields the plan was made from
)


class RunStore(Compaction):
    """A run directory on the local disk or on a pyarrow filesystem (URI): its files and atomic
    writes (`results.run.files.RunFiles`), the compaction of its shards (`Compaction`) and,
    here, RUN/plan.parquet, RUN/generations/ and RUN/scores/<scorer>/.
    """

    # ---- the plan: RUN/plan.parquet, one row group a planned chunk ----------------------

    def clean_temp(self) -> list[str]:
        """Delete the temp files a killed writer left in RUN/ itself, where only the driver
        writes, under the run's lock (so no live writer owns them); returns their paths."""
        stale = [
            i.path
            for i in self.entries()
            if i.type == pafs.FileType.File and i.base_name.startswith(".tmp-")
        ]
        for path in stale:
            self.fs.delete_file(path)
            log.info("removed %s (a temp file left by a killed writer)", path)
        return stale

    def write_plan_tables(
        self, tables: Iterable[pa.Table], fields: dict[str, Any] | None = None
    ) -> int:
        """Stream tables of PLAN_SCHEMA into plan.parquet (one row group each, the file
        appearing once all are written); returns rows. `fields`: the config fields the plan
        was made from (`results.run.identity.plan_fields`), kept in the footer."""
        self.clean_temp()
        rows = 0
        schema = with_schema_version(PLAN_SCHEMA.empty_table()).schema
        if fields is not None:
            meta = {**(schema.metadata or {}), PLAN_FIELDS_KEY: json.dumps(fields).encode()}
            schema = schema.with_metadata(meta)
        with self.open_atomic("plan.parquet") as out:
            with pq.ParquetWriter(out, schema, compression="zstd") as writer:
                for table in tables:
                    writer.write_table(table.cast(schema))
                    rows += table.num_rows
        return rows

    def write_plan_jobs(
        self, chunks: Iterable[Sequence[JobSpec]], fields: dict[str, Any] | None = None
    ) -> int:
        """Stream chunks of `JobSpec`s (e.g. `jobs.iter_plan` chunks' jobs) into plan.parquet."""
        return self.write_plan_tables(
            (pa.table(plan_columns(jobs), schema=PLAN_SCHEMA) for jobs in chunks), fields
        )

    def plan_fields(self) -> dict[str, Any] | None:
        """The config fields plan.parquet records (`write_plan_tables`); None: none recorded
        (a plan written before they were)."""
        path = self.path("plan.parquet")
        try:
            with self.fs.open_input_file(path) as fh:
                raw = (pq.read_schema(fh).metadata or {}).get(PLAN_FIELDS_KEY)
        except pa.ArrowInvalid as exc:  # not a transport fault: the file itself
            raise StoreError(f"{path}: unreadable Parquet file: {exc}") from exc
        return json.loads(raw) if raw else None

    def read_plan(self, columns: list[str] | None = None) -> pl.DataFrame:
        if not self.exists("plan.parquet"):
            raise StoreError(f"{self.uri}: no plan.parquet (not a run directory?)")
        return to_frame(self.read_parquet("plan.parquet", columns))

    def iter_plan(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """plan.parquet a row group (a planned chunk) at a time: memory of one chunk.

        A transport fault reopens the file and goes on at the row group that failed
        (`retry_io`'s attempts and waits, counted over the whole pass)."""
        path, done, failures = self.path("plan.parquet"), 0, 0
        while True:
            try:
                with self.fs.open_input_file(path) as fh:
                    plan = pq.ParquetFile(fh)
                    while done < plan.num_row_groups:
                        table = plan.read_row_group(done, columns=columns)
                        done += 1
                        yield table
                return
            except pa.ArrowInvalid as exc:  # damaged as stored (never quarantined): name it
                raise StoreError(f"{path}: unreadable Parquet file: {exc}") from exc
            except OSError as exc:
                failures += 1
                if failures >= shard_io.READ_TRIES:
                    raise StoreError(f"{path}: reading failed {failures} times: {exc}") from exc
                shard_io.pause(failures, path, exc)

    # ---- generation shards: one a finished batch, and the finished ids --------------------

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
        table = self.reader.scan(("generations",), GENERATION_SCHEMA, ["job_id", "status"])
        ids = pa.array([r["job_id"] for r in rows], pa.string())
        hit = pc.and_(pc.is_in(table["job_id"], value_set=ids), pc.equal(table["status"], "ok"))
        ok = set(table["job_id"].filter(pc.fill_null(hit, False)).to_pylist())
        left = [r for r in rows if r["job_id"] not in ok]
        if left:
            self.write_generations(left, kind="failed")
        return len(left)

    def read_generations(self, columns: list[str] | None = None) -> pl.DataFrame:
        """Every generation row, one per job id (an ok row wins over an error row)."""
        want = list(columns or GENERATION_SCHEMA.names)
        cols = want + [c for c in ("job_id", "status") if c not in want]
        table = self.reader.scan(("generations",), GENERATION_SCHEMA, cols)
        return to_frame(dedupe_generations(table)).select(want)

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
            yield to_frame(pa.Table.from_batches([batch]))

    def done_ids(self, include_errors: bool = True) -> DoneIds:
        """Ids of jobs with a row (only ok rows unless `include_errors`), compact and sorted."""
        ok, failed = self.finished_ids()
        return DoneIds(np.union1d(ok.ids, failed.ids)) if include_errors and len(failed) else ok

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
        cols = ["job_id", "model", "method", "task"]
        # an empty chunk last: a plan without row groups counts as one without rows
        for chunk in chain(self.iter_plan(columns=cols), [PLAN_SCHEMA.empty_table().select(cols)]):
            ids = chunk["job_id"].combine_chunks()
            frame = to_frame(chunk.select(cols[1:])).with_columns(
                pl.Series("done", ok.contains(ids)), pl.Series("failed", failed.contains(ids))
            )
            parts.append(
                frame.group_by(cols[1:], maintain_order=True).agg(
                    pl.len().alias("planned"), pl.col("done").sum(), pl.col("failed").sum()
                )
            )
        return (
            pl.concat(parts)
            .group_by(cols[1:], maintain_order=True)
            .agg(pl.col("planned", "done", "failed").sum())
            .with_columns((pl.col("planned") - pl.col("done") - pl.col("failed")).alias("pending"))
        )

    # ---- score shards: one a scored chunk, named by job ids and scorer versions -----------

    def score_dir(self, scorer: str) -> tuple[str, str]:
        """Where `write_scores` / `read_scores` keep a scorer's shards (`overwrite` stages)."""
        return ("scores", scorer)

    def write_scores(self, scorer: str, metric: str, rows: Sequence[dict[str, Any]]) -> str:
        """One atomic shard of score rows; its name hashes job ids *and* scorer versions, so a
        retried chunk rewrites its own file while a rescoring at a new version never
        overwrites the rows of the old one."""
        table = pa.Table.from_pylist(list(rows), score_schema(metric))
        keys = (f"{r['job_id']}\x00{r['scorer_version']}" for r in rows)
        return self.write_table("/".join(self.score_dir(scorer)) + "/" + shard_name(keys), table)

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
            stamps = {i.path: file_mtime(i) for i in infos}
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

    def scorers(self) -> list[str]:
        return [i.base_name for i in self.entries("scores") if i.type == pafs.FileType.Directory]

    def read_scores(
        self, scorer: str, metric: str, columns: list[str] | None = None
    ) -> pl.DataFrame:
        """Score rows of one scorer, one per (job id, scorer version), newest shard wins."""
        want = list(columns or score_schema(metric).names)
        cols = want + [c for c in ("job_id", "scorer_version") if c not in want]
        frame = to_frame(self.reader.scan(self.score_dir(scorer), score_schema(metric), cols))
        if frame["job_id"].n_unique() < frame.height:  # a job id twice: the newest shard wins
            frame = frame.unique(["job_id", "scorer_version"], keep="last", maintain_order=True)
        return frame.select(want)

"""plan.parquet: the jobs a run directory is bound to, written whole or streamed a planned chunk
at a time (`PlanFile`, a part of `results.run.store.RunStore`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from jobs.spec import JobSpec, plan_columns
from results.run import shards as shard_io
from results.run.files import RunFiles, to_frame, with_schema_version
from results.run.shards import StoreError
from results.schema import PLAN_SCHEMA

log = logging.getLogger("harness")


class PlanFile(RunFiles):
    """The plan of a run directory: RUN/plan.parquet."""

    def write_plan(self, rows: Sequence[dict[str, Any]]) -> str:
        return self.write_table("plan.parquet", pa.Table.from_pylist(list(rows), PLAN_SCHEMA))

    def clean_temp(self) -> list[str]:
        """Delete the temp files a killed writer left in RUN/ (`.tmp-…-plan.parquet`: a kill
        between closing the temp object and copying it into place); returns their paths.

        Only RUN/ itself: the driver writes there, under the run's lock, so no live writer
        owns them (actors write shards in the stage folders, never here).
        """
        stale = [
            i.path
            for i in self.entries()
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
        schema = with_schema_version(PLAN_SCHEMA.empty_table()).schema
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
        return to_frame(self.read_parquet("plan.parquet", columns))

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

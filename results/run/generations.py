"""Generation shards: RUN/generations/part-<hash>[-failed].parquet, one a finished batch, and the
ids and counts of finished jobs read from them (`GenerationShards`, a part of
`results.run.store.RunStore`). Reads keep one row per job id: an ok row wins over an error row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from results.run.done import DoneIds
from results.run.files import shard_name, to_frame
from results.run.plan_file import PlanFile
from results.run.shards import StoreError
from results.schema import GENERATION_SCHEMA, PLAN_SCHEMA


class GenerationShards(PlanFile):
    """The generation rows of a run directory, counted against its plan."""

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


def dedupe_generations(table: pa.Table) -> pa.Table:
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
        to_frame(keyed)
        .sort(["job_id", "bad", "i"])
        .unique("job_id", keep="first", maintain_order=True)
        .sort("i")
    )
    return table.take(first["i"].to_arrow())

"""Compaction of a folder's small shards into `part-c-` shards (`Compaction`, a part of
`RunStore`; docs/design.md, "Run directory"). New shards are written before the inputs are
deleted: a kill in between leaves rows twice on disk, which every read deduplicates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from results.run.done import DoneIds
from results.run.files import RunFiles, file_mtime, shard_name, to_frame
from results.run.shards import StoreError
from results.schema import CACHE_ANSWER_SCHEMA, GENERATION_SCHEMA, score_schema

log = logging.getLogger("harness")
COMPACT_TARGET_ROWS = 50_000  # rows per compacted shard (~5-20 MB of generations)
ANSWER_TARGET_ROWS = 16_384  # cached API answers per compacted shard (~0.8 MB; ~35 MB to merge)


class Compaction(RunFiles):
    """Merges the small shards of RUN/generations/ and of RUN/scores/<scorer>/."""

    def compact_generations(self, target_rows: int = COMPACT_TARGET_ROWS) -> int:
        """Merge the generation shards not yet compacted into `part-c-` shards of one row per
        job, sorted by slice (docs/design.md, "Run directory"); returns how many were merged."""
        return self._merge_small(
            ("generations",),
            "generation",
            lambda inputs, written: self._compact([i.path for i in inputs], target_rows, written),
        )

    def _merge_small(
        self, parts: tuple[str, ...], what: str, merge: Callable[[list[Any], list[str]], None]
    ) -> int:
        """The compaction of one folder (of `what` shards): its shards not yet compacted (two or
        more) are merged by `merge(inputs, written)`, which appends each shard it writes to
        `written` at once, then deleted. Returns how many were merged."""
        small = [i for i in self.reader.listing(parts) if not i.base_name.startswith("part-c-")]
        if len(small) < 2:
            return 0
        written: list[str] = []

        paths = [i.path for i in small]

        def attempt() -> None:
            self._delete_all(written)  # a failed attempt's outputs: start again
            written.clear()
            merge(self.reader.listing(parts, paths), written)  # not those quarantined

        try:  # transient faults wait and retry; damaged shards are quarantined on the way
            self.reader.retrying(attempt, parts=parts)
        except StoreError:
            self._delete_all(written)  # leave only whole inputs behind
            raise
        done = set(written)
        inputs = [i.path for i in self.reader.listing(parts, paths) if i.path not in done]
        self._delete_all(inputs)
        self.reader.forget(parts)
        if inputs:
            log.info(
                "compacted %d %s shards of %s into %d", len(inputs), what, self.uri, len(written)
            )
        return len(inputs)

    def _delete_all(self, paths: list[str]) -> None:
        with ThreadPoolExecutor(8) as pool:  # one request each on object stores
            list(pool.map(self.delete, paths))

    def _groups(
        self, parts: tuple[str, ...], schema: pa.Schema, only: list[str], target_rows: int
    ) -> Iterator[pa.Table]:
        """The rows of the shards `only`, streamed in shard order, in tables of about
        `target_rows` rows (memory: one table)."""
        group: list[pa.RecordBatch] = []
        for batch in self.reader.iter_batches(parts, schema, None, 8192, only=only):
            group.append(batch)
            if sum(b.num_rows for b in group) >= target_rows:
                yield pa.Table.from_batches(group, schema)
                group = []
        if group:
            yield pa.Table.from_batches(group, schema)

    def _compact(self, small: list[str], target_rows: int, written: list[str]) -> None:
        """Write the rows of `small` as compacted shards, a group of `target_rows` at a time."""
        both = self._failed_with_ok(small)
        for table in self._groups(("generations",), GENERATION_SCHEMA, small, target_rows):
            if len(both):  # an error row whose job has an ok row (in another group) goes
                is_ok = pc.fill_null(pc.equal(table["status"], "ok"), False)
                ids = table["job_id"].combine_chunks()
                keep = pc.or_(is_ok, pa.array(~both.contains(ids)))
                if not pc.all(keep).as_py():
                    table = table.filter(keep)
            table = dedupe_generations(table).sort_by(
                [(c, "ascending") for c in ("model", "method", "task", "job_id")]
            )
            if table.num_rows:
                name = shard_name(table["job_id"].to_pylist()).replace("part-", "part-c-", 1)
                written.append(self.write_table("generations/" + name, table))

    def _failed_with_ok(self, paths: list[str]) -> DoneIds:
        """Ids with an error row *and* an ok row among `paths`: two streamed scans of
        job_id/status, holding only ids of error rows (few, in a healthy run)."""

        def ids(ok: bool, among: DoneIds | None = None) -> DoneIds:
            found: list[pa.Array] = []
            for batch in self.reader.iter_batches(
                ("generations",), GENERATION_SCHEMA, ["job_id", "status"], 65_536, only=paths
            ):
                is_ok = pc.fill_null(pc.equal(batch.column("status"), "ok"), False)
                got = batch.column("job_id").filter(is_ok if ok else pc.invert(is_ok))
                found.append(got if among is None else got.filter(pa.array(among.contains(got))))
            return DoneIds.from_arrays(found)

        bad = ids(ok=False)
        return ids(ok=True, among=bad) if len(bad) else bad

    def compact_scores(
        self, scorer: str, metric: str, target_rows: int = COMPACT_TARGET_ROWS
    ) -> int:
        """Merge a scorer's chunk shards into `part-c-` shards of one version each; returns how
        many were merged. The footer's `lidao_versions` keeps the inputs' newest modification
        time, so that "the newest version" (`score_versions`) means the same after."""
        return self._merge_small(
            ("scores", scorer),
            f"{scorer} score",
            lambda inputs, written: self._compact_scores(
                scorer, score_schema(metric), inputs, target_rows, written
            ),
        )

    def _compact_scores(
        self,
        scorer: str,
        schema: pa.Schema,
        small: list[pafs.FileInfo],
        target_rows: int,
        written: list[str],
    ) -> None:
        """Write the rows of `small` as compacted shards (`compact_scores`)."""
        groups: dict[str, list[pa.Table]] = {}
        rows: dict[str, int] = {}
        stamps: dict[str, float] = {}

        def flush(version: str) -> None:
            table = pa.concat_tables(groups.pop(version))
            rows.pop(version)
            frame = to_frame(table).unique("job_id", keep="last", maintain_order=True)
            table = frame.to_arrow().cast(schema).sort_by("job_id")
            keys = (f"{j}\x00{version}" for j in table["job_id"].to_pylist())
            name = shard_name(keys).replace("part-", "part-c-", 1)
            meta = {b"lidao_versions": json.dumps({version: stamps[version]}).encode()}
            written.append(
                self.write_table(f"scores/{scorer}/{name}", table.replace_schema_metadata(meta))
            )

        mtimes = {i.path: file_mtime(i) for i in small}
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

    def compact_answers(self, parts: tuple[str, ...], target_rows: int = ANSWER_TARGET_ROWS) -> int:
        """Merge the answer shards of an API cache (RUN/<parts>/, `CACHE_ANSWER_SCHEMA`) into
        `part-c-` shards of about `target_rows` rows, streamed (memory: one group); returns how
        many shards were merged. Compacted shards are never merged again, so an answer is
        uploaded at most twice: in its shard, then in a compacted one."""

        def merge(inputs: list[pafs.FileInfo], written: list[str]) -> None:
            only = [i.path for i in inputs]
            for table in self._groups(parts, CACHE_ANSWER_SCHEMA, only, target_rows):
                columns = (table[c].to_pylist() for c in table.column_names[:4])
                name = "part-c-" + shard_name("\x00".join(k) for k in zip(*columns))[5:]
                written.append(self.write_table("/".join([*parts, name]), table))

        return self._merge_small(parts, "answer", merge)


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

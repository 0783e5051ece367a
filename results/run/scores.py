"""Score shards: RUN/scores/<scorer>/part-<hash>.parquet, one a scored chunk, named by job ids
and scorer versions (`ScoreShards`, a part of `results.run.store.RunStore`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from results.run.files import RunFiles, file_mtime, shard_name, to_frame
from results.schema import score_schema


class ScoreShards(RunFiles):
    """The score rows of a run directory, per scorer and scorer version."""

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
        frame = to_frame(self.reader.scan(self.score_dir(scorer), score_schema(metric), cols))
        if frame.is_empty() or frame["job_id"].n_unique() == frame.height:
            return frame.select(want)  # no job id twice (the usual case): no costly unique
        return frame.unique(["job_id", "scorer_version"], keep="last", maintain_order=True).select(
            want
        )

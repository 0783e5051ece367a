"""The run directory: atomic Parquet shards, the plan, the manifest.

Layout (see docs/design.md)::

    RUN/config.yaml  manifest.json  plan.parquet
    RUN/generations/part-<hash>.parquet
    RUN/scores/<scorer>/part-<hash>.parquet
    RUN/summary.parquet  summary.csv  report/

A shard is complete or absent: local files are written to a temp file in the same folder,
fsynced and renamed (`os.replace`); object stores (s3://, gs://) put whole objects. Shard names
are hashes of the job ids they hold, so a retried batch rewrites the same file.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.schema import GENERATION_SCHEMA, PLAN_SCHEMA, SCHEMA_VERSION, score_schema


class StoreError(RuntimeError):
    """A run directory that cannot be read or written as asked."""


def shard_name(job_ids: Iterable[str]) -> str:
    digest = hashlib.sha256("\n".join(sorted(job_ids)).encode()).hexdigest()[:24]
    return f"part-{digest}.parquet"


class RunStore:
    """A run directory on the local disk or on a pyarrow filesystem (URI)."""

    def __init__(self, root: str) -> None:
        self.uri = root
        if "://" in root:
            self.fs, self.root = pafs.FileSystem.from_uri(root)
            self.local = isinstance(self.fs, pafs.LocalFileSystem)
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
            self.local = True

    # ---- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def exists(self, *parts: str) -> bool:
        info = self.fs.get_file_info(self.path(*parts))
        return info.type != pafs.FileType.NotFound

    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def list_shards(self, *parts: str) -> list[str]:
        sel = pafs.FileSelector(self.path(*parts), allow_not_found=True)
        infos = self.fs.get_file_info(sel)
        return sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.File
            and i.base_name.startswith("part-")
            and i.base_name.endswith(".parquet")
        )

    # ---- atomic writes -------------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> str:
        """Write `data` to RUN/rel atomically; returns the full path."""
        target = self.path(rel)
        parent = target.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if self.local:
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
                dir_fd = os.open(parent, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        else:  # object stores: a put is all-or-nothing
            with self.fs.open_output_stream(target) as out:
                out.write(data)
        return target

    def write_table(self, rel: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        meta = dict(table.schema.metadata or {})
        meta[b"lidao_schema_version"] = str(SCHEMA_VERSION).encode()
        pq.write_table(table.replace_schema_metadata(meta), buf, compression="zstd")
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

    # ---- tables --------------------------------------------------------------------------
    def write_plan(self, rows: Sequence[dict[str, Any]]) -> str:
        return self.write_table("plan.parquet", pa.Table.from_pylist(list(rows), PLAN_SCHEMA))

    def read_plan(self) -> pl.DataFrame:
        if not self.exists("plan.parquet"):
            raise StoreError(f"{self.uri}: no plan.parquet (not a run directory?)")
        return self._read_one(self.path("plan.parquet"))

    def write_generations(self, rows: Sequence[dict[str, Any]]) -> str:
        """One atomic shard of generation rows (a finished batch)."""
        table = pa.Table.from_pylist(list(rows), GENERATION_SCHEMA)
        return self.write_table("generations/" + shard_name(r["job_id"] for r in rows), table)

    def read_generations(self) -> pl.DataFrame:
        """Every generation row, one per job id (an ok row wins over an error row)."""
        frame = self._read_dir(("generations",), GENERATION_SCHEMA)
        if frame.is_empty():
            return frame
        return (
            frame.with_columns((pl.col("status") == "ok").alias("_ok"))
            .sort(["job_id", "_ok"], descending=[False, True])
            .unique("job_id", keep="first", maintain_order=True)
            .drop("_ok")
        )

    def done_job_ids(self, include_errors: bool = True) -> set[str]:
        frame = self._read_dir(("generations",), GENERATION_SCHEMA, columns=["job_id", "status"])
        if not include_errors:
            frame = frame.filter(pl.col("status") == "ok")
        return set(frame["job_id"].to_list())

    def write_scores(self, scorer: str, metric: str, rows: Sequence[dict[str, Any]]) -> str:
        """One atomic shard of score rows; its name hashes job ids *and* scorer versions, so a
        retried chunk rewrites its own file while a rescoring at a new version never
        overwrites the rows of the old one."""
        table = pa.Table.from_pylist(list(rows), score_schema(metric))
        keys = (f"{r['job_id']}\x00{r['scorer_version']}" for r in rows)
        return self.write_table(f"scores/{scorer}/" + shard_name(keys), table)

    def scorers(self) -> list[str]:
        sel = pafs.FileSelector(self.path("scores"), allow_not_found=True)
        return sorted(
            i.base_name for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.Directory
        )

    def read_scores(self, scorer: str, metric: str) -> pl.DataFrame:
        """Score rows of one scorer, one per (job id, scorer version), newest shard wins."""
        frame = self._read_dir(("scores", scorer), score_schema(metric))
        if frame.is_empty():
            return frame
        return frame.unique(["job_id", "scorer_version"], keep="last", maintain_order=True)

    # ---- reading -------------------------------------------------------------------------
    def _read_one(self, path: str, columns: list[str] | None = None) -> pl.DataFrame:
        with self.fs.open_input_file(path) as fh:
            table = pq.read_table(fh, columns=columns)
        version = int((table.schema.metadata or {}).get(b"lidao_schema_version", b"1"))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path}: written with schema version {version}, this code reads up to "
                f"{SCHEMA_VERSION}; upgrade lidao-harness"
            )
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        return frame

    def _read_dir(
        self, parts: tuple[str, ...], schema: pa.Schema, columns: list[str] | None = None
    ) -> pl.DataFrame:
        """Concatenate shards in name order; columns a shard lacks (older schema) are null."""
        want = columns or schema.names
        empty = pl.from_arrow(schema.empty_table().select(want))
        assert isinstance(empty, pl.DataFrame)
        frames = []
        for path in self.list_shards(*parts):
            frame = self._read_one(path)
            missing = [c for c in want if c not in frame.columns]
            frame = frame.with_columns([pl.lit(None).alias(c) for c in missing]).select(want)
            frames.append(frame.cast(empty.schema))  # type: ignore[arg-type]
        if not frames:
            return empty
        return pl.concat(frames, how="vertical")

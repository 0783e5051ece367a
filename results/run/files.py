"""The files of a run directory: paths, listings, atomic writes (bytes, JSON, Parquet) and the
names of shards (`RunFiles`, the base of `results.run.store.RunStore`)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.run.reader import ShardReader
from results.run.shards import atomic_output, open_filesystem, put_bytes
from results.schema import SCHEMA_VERSION


def shard_name(job_ids: Iterable[str], kind: str = "") -> str:
    """`part-<hash of the sorted ids>[-kind].parquet`."""
    digest = hashlib.sha256("\n".join(sorted(job_ids)).encode()).hexdigest()[:24]
    return f"part-{digest}{'-' + kind if kind else ''}.parquet"


class RunFiles:
    """A run directory on the local disk or on a pyarrow filesystem (URI): its files."""

    def __init__(self, root: str) -> None:
        self.uri = root
        self.fs, self.root = self._open()
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.reader = ShardReader(self.fs, self.root, self.uri, reopen=lambda: self._open()[0])

    def _open(self) -> tuple[pafs.FileSystem, str]:
        """(a new filesystem client: fresh connections, the run's path on it)."""
        if "://" in self.uri:
            return open_filesystem(self.uri)
        return pafs.LocalFileSystem(), os.path.abspath(self.uri)

    # ---- paths ---------------------------------------------------------------------------
    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def delete(self, path: str) -> None:
        """Remove one file (a full path, as `list_shards` gives)."""
        self.fs.delete_file(path)

    def makedirs(self, *parts: str) -> None:
        self.fs.create_dir(self.path(*parts), recursive=True)

    def list_shards(self, *parts: str) -> list[str]:
        return [i.path for i in self.reader.listing(parts)]

    def entries(self, *parts: str, recursive: bool = False) -> list[pafs.FileInfo]:
        """What RUN/<parts> holds, sorted by path (nothing where it does not exist)."""
        sel = pafs.FileSelector(self.path(*parts), allow_not_found=True, recursive=recursive)
        return sorted(self.fs.get_file_info(sel), key=lambda i: i.path)

    @property
    def quarantined(self) -> list[str]:
        """Shards this store moved aside as unreadable (full paths under RUN/quarantine/)."""
        return list(self.reader.quarantined)

    def quarantine_files(self) -> list[str]:
        """Every file under RUN/quarantine/ (also those moved by earlier runs)."""
        entries = self.entries("quarantine", recursive=True)
        return [i.path for i in entries if i.type == pafs.FileType.File]

    def shard_mtimes(self, *parts: str) -> list[float]:
        """Modification times (unix seconds) of the shards in RUN/<parts>: one listing."""
        return [file_mtime(i) for i in self.reader.listing(parts) if i.mtime is not None]

    # ---- atomic writes -------------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> str:
        """Write `data` to RUN/rel atomically; returns the full path."""
        return put_bytes(self.fs, self.path(rel), data, self.local)

    def open_atomic(self, rel: str) -> Any:
        """Context manager: a stream that lands at RUN/rel only if the block ends normally."""
        return atomic_output(self.fs, self.path(rel), self.local)

    def write_table(self, rel: str, table: pa.Table) -> str:
        buf = io.BytesIO()
        pq.write_table(with_schema_version(table), buf, compression="zstd")
        return self.write_bytes(rel, buf.getvalue())

    def read_parquet(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """RUN/rel, a Parquet file that is not a shard (the plan, a summary, a key)."""
        return self.reader.read_file(self.path(rel), columns)

    def write_json(self, rel: str, obj: Any) -> str:
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)
        return self.write_bytes(rel, text.encode())

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def read_text(self, rel: str) -> str:
        with self.fs.open_input_stream(self.path(rel)) as fh:
            return str(fh.read().decode())


def file_mtime(info: pafs.FileInfo) -> float:
    """A listed file's modification time (unix seconds; 0 where the filesystem gives none)."""
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def with_schema_version(table: pa.Table) -> pa.Table:
    """`table` with the schema version this code writes in its metadata (`check_version`)."""
    meta = dict(table.schema.metadata or {})
    meta[b"lidao_schema_version"] = str(SCHEMA_VERSION).encode()
    return table.replace_schema_metadata(meta)


def to_frame(table: pa.Table) -> pl.DataFrame:
    """A Polars frame of an Arrow table."""
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame

"""Reads of a run directory's shards (`ShardReader`: cached scans, streamed batches, retries)
and the quarantine of shards damaged as stored (docs/design.md, "Run directory"): a transport
fault never moves a shard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from results.run import shards
from results.run.shards import NewerSchemaError, StoreError, check_version

log = logging.getLogger("harness")
T = TypeVar("T")
SCAN_GROUP = 128  # shards per streamed dataset scan (`ShardReader.iter_batches`)


class ShardReader:
    """Scans folders of `part-*.parquet` shards under `root`, with a cache and a quarantine."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        uri: str,
        threads: int = 8,
        reopen: Callable[[], pafs.FileSystem] | None = None,
    ) -> None:
        self.fs, self.root, self.uri, self.threads = fs, root.rstrip("/"), uri, threads
        self.reopen = reopen or (lambda: fs)  # a new client (fresh connections) for the probe
        self.quarantined: list[str] = []
        self.retries = 0  # reads that failed and were tried again (stats, tests)
        self._cache: dict[tuple[str, ...], tuple[Any, list[str] | None, pa.Table]] = {}
        self._moved: set[str] = set()  # paths quarantined by this reader
        self._sizes: dict[str, int] = {}  # path → size from the last listing (no HEAD per read)
        self._checked: set[str] = set()  # paths whose schema version was checked

    def listing(
        self, parts: Sequence[str], only: Sequence[str] | None = None
    ) -> list[pafs.FileInfo]:
        """The `part-*.parquet` shards of RUN/<parts> (those among the paths `only`): one LIST
        request (per 1,000 objects) on object stores, with each shard's size and mtime."""
        sel = pafs.FileSelector("/".join([self.root, *parts]), allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except OSError as exc:
            raise StoreError(f"{self.uri}: listing {'/'.join(parts)} failed: {exc}") from exc
        files = [i for i in infos if i.type == pafs.FileType.File]
        self._sizes.update((i.path, i.size) for i in files)
        wanted = None if only is None else set(only)
        found = [
            i
            for i in files
            if i.base_name.startswith("part-")
            and i.base_name.endswith(".parquet")
            and (wanted is None or i.path in wanted)
        ]
        return sorted(found, key=lambda i: i.path)

    def dataset(self, paths: Sequence[str], schema: pa.Schema) -> ds.FileSystemDataset:
        """A dataset of `paths`; sizes known from a listing are passed on, so that reading a
        shard on an object store needs no HEAD request first."""
        fmt = ds.ParquetFileFormat()
        fragments = [
            fmt.make_fragment(p, filesystem=self.fs, file_size=self._sizes.get(p)) for p in paths
        ]
        return ds.FileSystemDataset(fragments, schema, fmt, self.fs)

    def forget(self, parts: Sequence[str]) -> None:
        self._cache.pop(tuple(parts), None)

    def scan(
        self,
        parts: Sequence[str],
        schema: pa.Schema,
        columns: list[str] | None,
        only: list[str] | None = None,
    ) -> pa.Table:
        """Rows of every shard in RUN/<parts> (or of the paths `only`), cast to `schema`;
        columns a shard lacks (older schema) are null."""
        key = tuple(parts)
        infos = self.listing(parts, only)
        signature = tuple((i.path, i.size, i.mtime_ns) for i in infos)
        cached = self._cache.get(key)
        if only is None and cached is not None and cached[0] == signature:
            have = cached[1]
            if have is None or (columns is not None and set(columns) <= set(have)):
                return cached[2] if columns is None else cached[2].select(columns)
        table = self._scan_paths([i.path for i in infos], schema, columns)
        if only is None:
            # quarantine changed the listing: the next call lists again and rescans
            self._cache[key] = (signature, columns, table)
        return table

    def _scan_paths(self, paths: list[str], schema: pa.Schema, cols: list[str] | None) -> pa.Table:
        want, alive = cols or schema.names, list(paths)

        def read() -> pa.Table:
            alive[:] = [p for p in alive if p not in self._moved]
            if not alive:
                return schema.empty_table().select(want)
            dataset = self.dataset(alive, schema)
            try:
                table = dataset.to_table(columns=want, use_threads=True)
            except (pa.ArrowException, OSError) as exc:
                raise StoreError(f"{self.uri}: reading {len(alive)} shards failed: {exc}") from exc
            self._check_versions(dataset)
            return table

        return self.retrying(read, paths)

    def retrying(
        self,
        read: Callable[[], T],
        paths: Sequence[str] | None = None,
        parts: Sequence[str] | None = None,
    ) -> T:
        """`read()`, tried again when it raises `StoreError`: at once when shards among `paths`
        (or listed in RUN/<parts>) were damaged as stored and quarantined, else after a wait
        (`RETRY_BACKOFF_S`, doubling), up to `READ_TRIES` attempts."""
        attempt = 1
        while True:
            try:
                return read()
            except NewerSchemaError:
                raise  # not a fault of the storage
            except StoreError as exc:
                if parts is not None:
                    try:
                        paths = [i.path for i in self.listing(parts)]
                    except StoreError:
                        paths = []
                todo = [p for p in paths or () if p not in self._moved]
                bad = self._damaged(todo)
                for path, error in bad.items():
                    self.quarantined.append(move_aside(self.fs, self.root, self.uri, path, error))
                    self._moved.add(path)
                if bad:
                    continue  # the read goes on without them
                if attempt >= shards.READ_TRIES:
                    raise StoreError(
                        f"{exc} (tried {shards.READ_TRIES} times; no shard is damaged as stored: "
                        "a storage or network fault? run the command again)"
                    ) from exc
                self.retries += 1
                shards.pause(attempt, self.uri, exc)
                attempt += 1

    def iter_batches(
        self,
        parts: Sequence[str],
        schema: pa.Schema,
        columns: list[str] | None,
        batch_rows: int,
        only: list[str] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Record batches of every shard in RUN/<parts> (or of the paths `only`), in shard
        order, read ahead in parallel."""
        paths = [i.path for i in self.listing(parts, only)]
        # A dataset scan keeps ~100 KB per shard it has read until it ends (measured: +200 MB
        # for 2,000 shards): scan a group of shards at a time, so memory does not grow with them.
        for start in range(0, len(paths), SCAN_GROUP):
            group = paths[start : start + SCAN_GROUP]
            dataset = self.dataset(group, schema)
            try:
                for batch in dataset.to_batches(columns=columns, batch_size=batch_rows):
                    if batch.num_rows:
                        yield batch
            except (pa.ArrowException, OSError) as exc:
                raise StoreError(f"{self.uri}: reading {'/'.join(parts)} failed: {exc}") from exc
            self._check_versions(dataset)  # footers were read by the scan: no extra requests

    def count_rows(self, parts: Sequence[str], schema: pa.Schema) -> int:
        """Rows on disk in RUN/<parts> (from the footers; duplicates counted)."""
        paths = [i.path for i in self.listing(parts)]
        return sum(
            int(self.dataset(group, schema).count_rows())
            for group in (paths[i : i + SCAN_GROUP] for i in range(0, len(paths), SCAN_GROUP))
        )

    def _check_versions(self, dataset: ds.FileSystemDataset) -> None:
        for fragment in dataset.get_fragments():
            if fragment.path not in self._checked:
                check_version(fragment.path, fragment.physical_schema.metadata)
                self._checked.add(fragment.path)

    def _damaged(self, paths: list[str]) -> dict[str, str]:
        return damaged(self.reopen, paths, self.uri, self.threads)

    def read_shard(
        self, path: str, schema: pa.Schema, columns: list[str] | None = None
    ) -> tuple[pa.Table, dict[bytes, bytes]]:
        """One shard as `schema` (missing columns null) and its footer's key-value metadata;
        the size from the last listing spares a HEAD request. Errors are `StoreError`s."""
        fmt = ds.ParquetFileFormat()
        fragment = fmt.make_fragment(path, filesystem=self.fs, file_size=self._sizes.get(path))
        try:
            table = fragment.to_table(schema=schema, columns=columns)
            meta = dict(fragment.physical_schema.metadata or {})
        except (pa.ArrowException, OSError) as exc:
            raise StoreError(f"{path}: reading failed: {exc}") from exc
        check_version(path, meta)
        return table, meta

    def read_shards(
        self, paths: Sequence[str], schema: pa.Schema, columns: list[str] | None = None
    ) -> Iterator[tuple[str, pa.Table, dict[bytes, bytes]]]:
        """`read_shard` of each path, in order, `threads` at a time (a window of
        `SCAN_GROUP` read ahead: memory of that many small shards)."""
        with ThreadPoolExecutor(self.threads) as pool:
            for start in range(0, len(paths), SCAN_GROUP):
                window = list(paths[start : start + SCAN_GROUP])
                got = pool.map(lambda p: self.read_shard(p, schema, columns), window)
                for path, (table, meta) in zip(window, got, strict=True):
                    yield path, table, meta

    def read_file(self, path: str, columns: list[str] | None = None) -> pa.Table:
        """One Parquet file (e.g. the plan); an unreadable one is an error naming it."""

        def read() -> pa.Table:
            with self.fs.open_input_file(path) as fh:
                return pq.read_table(fh, columns=columns)

        try:
            table = shards.retry_io(read, path)
        except (pa.ArrowException, OSError) as exc:
            msg = str(exc).replace("'<Buffer>'", f"'{path}'")
            raise StoreError(f"{path}: unreadable Parquet file: {msg}") from exc
        check_version(path, table.schema.metadata)
        return table


def damaged(
    reopen: Callable[[], pafs.FileSystem], paths: list[str], uri: str, threads: int
) -> dict[str, str]:
    """path → error of each shard among `paths` that is damaged as stored (`threads` at a time).

    On a fresh client (`reopen()`: new connections), each object is fetched whole; only when
    the bytes fetched are as many as the object's size says (a short or failed fetch is a
    transport fault, never damage) and they do not parse as Parquet is the shard damaged.
    """
    if not paths:
        return {}
    try:
        fs = reopen()
        sizes = {i.path: i.size for i in fs.get_file_info(list(paths))}
    except OSError as exc:  # cannot even ask: nothing can be judged damaged
        log.info("%s: sizes unknown on a fresh connection (%s): nothing quarantined", uri, exc)
        return {}

    def probe(path: str) -> str | None:
        try:
            with fs.open_input_stream(path) as fh:
                data = fh.read()
        except (pa.ArrowException, OSError) as exc:
            log.info("%s: fetch failed on a fresh connection (%s): not quarantined", path, exc)
            return None
        if sizes.get(path) is not None and len(data) != sizes[path]:
            log.info("%s: %d of %d bytes fetched: not quarantined", path, len(data), sizes[path])
            return None
        try:
            pq.read_table(pa.BufferReader(data))
        except (pa.ArrowException, OSError) as exc:
            return str(exc).replace("'<Buffer>'", f"'{path}'")
        return None

    with ThreadPoolExecutor(threads) as pool:
        errors = list(pool.map(probe, paths))
    return {p: e for p, e in zip(paths, errors, strict=True) if e is not None}


def move_aside(fs: pafs.FileSystem, root: str, uri: str, path: str, error: str) -> str:
    """Move the shard `path` of the run at `root` (`uri` in the log) to
    `root`/quarantine/<its path under root>, saying why (`error`); returns where it went."""
    rel = path[len(root) + 1 :] if path.startswith(root + "/") else path
    dest = f"{root}/quarantine/{rel}"
    fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
    fs.move(path, dest)
    log.warning(
        "%s/%s: unreadable shard (%s); moved to %s/quarantine/%s, its jobs are pending again",
        uri,
        rel,
        error,
        uri,
        rel,
    )
    return dest

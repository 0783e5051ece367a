"""The quarantine of a run directory: shards damaged as stored (`damaged`) are moved to
RUN/quarantine/<their path in the run> (`move_aside`), their jobs pending again.
`ShardReader.retrying` (`results.run.reader`) calls both when a read fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

log = logging.getLogger("harness")


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

"""Low-level file I/O of a run directory (docs/design.md, "Run directory"): its filesystem,
atomic writes, retried reads of single files, the schema-version check and `StoreError`. On
object stores a streamed object goes to a temp key: pyarrow's Python streams have no abort, and
closing one publishes what was written so far.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow.fs as pafs

from results.schema import SCHEMA_VERSION

log = logging.getLogger("harness")
T = TypeVar("T")
S3_MAX_ATTEMPTS = 6  # per S3 request, by the SDK (AwsStandardS3RetryStrategy), with its backoff
READ_TRIES = 3  # project-level attempts of a whole read (the resume check, a scan)
RETRY_BACKOFF_S = 1.0  # sleep before the 2nd attempt; doubles after each


def open_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) of a URI, as `FileSystem.from_uri`, except that an S3 filesystem
    retries transient errors (`S3_MAX_ATTEMPTS`) and writes a small object with one PutObject
    (`allow_delayed_open`: the multipart upload starts only past the first part's size).
    Each call builds a new client (fresh connections: the damage probe's)."""
    fs, path = pafs.FileSystem.from_uri(uri)
    if isinstance(fs, pafs.S3FileSystem):
        rebuild, (options,) = fs.__reduce__()  # the options the URI gave (endpoint, region...)
        options = dict(options)
        options.update(
            allow_delayed_open=True,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS),
        )
        fs = rebuild(options)
    return fs, path


class StoreError(RuntimeError):
    """A run directory that cannot be read or written as asked."""


def pause(attempt: int, what: str, exc: BaseException) -> None:
    """Logs a failed read and sleeps before attempt `attempt + 1` (`RETRY_BACKOFF_S`, doubling)."""
    delay = RETRY_BACKOFF_S * 2 ** (attempt - 1)
    why, tries = str(exc)[:300], f"{attempt + 1} of {READ_TRIES}"
    log.warning("%s: read failed (%s); trying again in %.1fs (%s)", what, why, delay, tries)
    time.sleep(delay)


def retry_io(read: Callable[[], T], what: str) -> T:
    """`read()`, tried `READ_TRIES` times (`pause` between) while it raises
    an `OSError` (pyarrow's S3 and network errors are); a file that is not Parquet
    (`ArrowInvalid`) is not retried. For single files such as the plan (never quarantined)."""
    for attempt in range(1, READ_TRIES):
        try:
            return read()
        except OSError as exc:
            pause(attempt, what, exc)
    return read()


class NewerSchemaError(StoreError):
    """A shard written by a newer schema version than this code reads (never retried)."""


def check_version(path: str, metadata: dict[bytes, bytes] | None) -> None:
    """Raises `StoreError` for a file written by a newer schema than this code reads."""
    version = int((metadata or {}).get(b"lidao_schema_version", b"1"))
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(
            f"{path}: written with schema version {version}, this code reads up to "
            f"{SCHEMA_VERSION}; upgrade lidao-harness"
        )


# ---- writes ----------------------------------------------------------------------------------
def put_bytes(fs: pafs.FileSystem, target: str, data: bytes, local: bool) -> str:
    """Write `data` to `target` atomically; returns `target`.

    On object stores one put of complete bytes is all-or-nothing, without create_dir: they have
    no folders, and the marker would cost as much as the put."""
    with atomic_output(fs, target, local=True) if local else fs.open_output_stream(target) as out:
        out.write(data)
    return target


@contextlib.contextmanager
def atomic_output(fs: pafs.FileSystem, target: str, local: bool) -> Iterator[Any]:
    """A writable stream whose content lands at `target` only if the block ends normally."""
    parent, name = target.rsplit("/", 1)
    tmp = f"{parent}/.tmp-{uuid.uuid4().hex[:12]}-{name}"
    if local:
        fs.create_dir(parent, recursive=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # mode follows the umask
        try:
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            dir_fd = os.open(parent, os.O_RDONLY)  # the rename itself survives a crash
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return
    out = fs.open_output_stream(tmp)
    try:
        yield out
    except BaseException:
        with contextlib.suppress(Exception):
            out.close()  # publishes the temp key: delete it
        with contextlib.suppress(Exception):
            fs.delete_file(tmp)
        raise
    out.close()
    try:
        fs.copy_file(tmp, target)
    finally:
        with contextlib.suppress(Exception):
            fs.delete_file(tmp)

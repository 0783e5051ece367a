"""One driver per run directory: `RunLock`.

Local run directories: `fcntl.flock` on `RUN/.lock`. The kernel releases the lock when the
holding process dies (even by SIGKILL), so a crashed driver never leaves a stale lock; the
file keeps the last holder's pid, host and start time for the refusal message.

Object stores (s3://, gs://) have no locks: a *lease* object `RUN/.lease.json` (holder and
expiry) is written at start and deleted at the end. It is best effort: two drivers starting
within the same second can both win, and a driver killed hard leaves a lease that blocks
others until it expires (`LEASE_S`, 6 hours; delete the object to take over sooner).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
from typing import Any

from results.run.store import RunStore, StoreError

LOCK_FILE = ".lock"
LEASE_FILE = ".lease.json"
LEASE_S = 6 * 3600.0


class LockedError(StoreError):
    """Another driver holds the run directory."""


def holder_info(command: str) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _describe(info: dict[str, Any]) -> str:
    return (
        f"pid {info.get('pid')} on {info.get('host')}, `{info.get('command')}` "
        f"started {info.get('started')}"
    )


class RunLock:
    """Context manager holding the run directory for one driver; raises `LockedError`."""

    def __init__(self, store: RunStore, command: str) -> None:
        self.store = store
        self.info = holder_info(command)
        self._fd: int | None = None
        self._lease = False

    def __enter__(self) -> RunLock:
        self.store.makedirs()
        if self.store.local:
            self._flock()
        else:
            self._take_lease()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _flock(self) -> None:
        import fcntl

        path = self.store.path(LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            except ValueError:
                holder = {}
            os.close(fd)
            raise LockedError(
                f"{self.store.uri} is in use by another driver ({_describe(holder)}); "
                "wait for it to finish or use another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.info).encode(), 0)
        self._fd = fd

    def _take_lease(self) -> None:
        if self.store.exists(LEASE_FILE):
            try:
                lease = self.store.read_json(LEASE_FILE)
            except (OSError, ValueError):
                lease = {}
            if float(lease.get("expires", 0)) > time.time():
                raise LockedError(
                    f"{self.store.uri} holds a lease of another driver ({_describe(lease)}, "
                    f"expires in {float(lease['expires']) - time.time():.0f}s); if that driver "
                    f"is dead, delete {self.store.uri}/{LEASE_FILE}"
                )
        self.store.write_json(LEASE_FILE, {**self.info, "expires": time.time() + LEASE_S})
        self._lease = True

    def release(self) -> None:
        if self._fd is not None:
            import fcntl

            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._lease:
            self._lease = False
            try:
                self.store.fs.delete_file(self.store.path(LEASE_FILE))
            except OSError:
                pass

"""What every command that writes a run directory shares, `driven(store, command)`: one driver
(`RunLock`), SIGINT / SIGTERM raised as `Interrupted`, the invocation's record, and a local Ray
stopped with what is left of its process tree (docs/design.md, "Record", "One driver").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from results.run.history import Invocation, append_record, rebuild_manifest
from results.run.store import RunStore, StoreError

log = logging.getLogger("harness")
LOCK_FILE = ".lock"
LEASE_FILE = ".lease.json"
LEASE_S = 6 * 3600.0


class LockedError(StoreError):
    """Another driver holds the run directory."""


def _describe(info: dict[str, Any]) -> str:
    return (
        f"pid {info.get('pid')} on {info.get('host')}, `{info.get('command')}` "
        f"started {info.get('started')}"
    )


class RunLock:
    """Context manager holding the run directory for one driver; raises `LockedError`.

    `fcntl.flock` on `RUN/.lock` (the kernel releases it when the holder dies, so no lock is
    ever stale); object stores have no locks: a best-effort lease object (docs/design.md,
    "One driver"). Either keeps the holder's pid, host and start for the refusal message.
    """

    def __init__(self, store: RunStore, command: str) -> None:
        self.store = store
        self.info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command}
        self.info["started"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self._fd: int | None = None
        self._lease = False

    def __enter__(self) -> RunLock:
        self.store.makedirs()
        self._flock() if self.store.local else self._take_lease()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _flock(self) -> None:
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
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._lease:
            self._lease = False
            with contextlib.suppress(OSError):
                self.store.fs.delete_file(self.store.path(LEASE_FILE))


class Interrupted(KeyboardInterrupt):
    """SIGINT / SIGTERM: `code` is the exit status (128 + signal number). A `KeyboardInterrupt`:
    Ray's blocking calls pass on no other exception (the signal would be lost), and raise a bare
    one of their own, to which `interrupted` gives back its signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.code = 128 + signum


_last_signal: list[int] = []  # the signal the handler raised last (one slot)
_unhandled: list[int] = []  # a signal raised as `Interrupted` that `driven` has not yet seen


def _raise(signum: int, frame: FrameType | None) -> None:
    _last_signal[:] = [signum]
    _unhandled[:] = [signum]
    raise Interrupted(signum)


def check_interrupt() -> None:
    """Raise again an interrupt that was swallowed: the handler runs wherever the main thread
    is, and an exception raised inside a `__del__`, a weakref callback or a C callback is
    printed as "Exception ignored" and dropped (tqdm's `__del__` did so after generation).
    Called from the driver's loops and at the end of a command; only in the main thread, where
    a signal still unhandled there can only mean a swallowed one."""
    if _unhandled and threading.current_thread() is threading.main_thread():
        raise Interrupted(_unhandled[0])


def interrupted(exc: KeyboardInterrupt) -> Interrupted:
    """`exc` as an `Interrupted`: itself, or for the bare `KeyboardInterrupt` Ray raises (or
    Python's default SIGINT handler), one of the signal the handler saw last."""
    if isinstance(exc, Interrupted):
        return exc
    return Interrupted(_last_signal[0] if _last_signal else signal.SIGINT)


@contextlib.contextmanager
def _handling(handler: Any) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` while the block runs."""
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread while the block runs."""
    with _handling(_raise):
        _unhandled.clear()
        yield


@contextlib.contextmanager
def driven(store: RunStore, command: str) -> Iterator[Invocation]:
    """Lock, record and clean up around one command on `store` (the module docstring)."""
    inv = Invocation(command)
    with signals_raise(), RunLock(store, command):
        outcome = "error"
        try:
            yield inv
            check_interrupt()
            outcome = "ok"
        except KeyboardInterrupt as exc:
            _unhandled.clear()
            outcome = f"interrupted ({signal.Signals(interrupted(exc).signum).name})"
            raise
        except OSError as exc:  # a full disk inside pyarrow names no file: name run and stage
            if not exc.filename:
                exc.add_note(f"{command} {store.uri}, {_running(inv)}")
            raise
        finally:
            # a second Ctrl-C must not leave Ray half stopped or the record unwritten
            with _handling(signal.SIG_IGN):
                stop_local_ray()
                _record(store, inv, outcome)


_STAGES = ("plan", "generation", "scoring", "aggregate")


def _running(inv: Invocation) -> str:
    """The stage `inv` was in: the one after the last it finished (a command's first else)."""
    done = [_STAGES.index(s) for s in inv.stages if s in _STAGES]
    first = {"run": 0, "score": 2}.get(inv.command, 3)
    return f"{_STAGES[min(max(done, default=first - 1) + 1, len(_STAGES) - 1)]} stage"


def _record(store: RunStore, inv: Invocation, outcome: str) -> None:
    try:
        append_record(store, inv.record(outcome))
        rebuild_manifest(store)
    except OSError as exc:  # a full disk must not hide the error that brought us here
        log.warning("%s: could not write the run record: %s", store.uri, exc)


def stop_local_ray(grace_s: float = 5.0) -> None:
    """Shut Ray down; if this process started a local Ray, kill what is left of its processes.

    `ray.shutdown()` stops the raylet and GCS it started, but a worker busy in a C call can
    outlive them; the process tree under this driver is collected first and reaped after.
    """
    if "ray" not in sys.modules:
        return
    import ray

    if not ray.is_initialized():
        return
    tree = _descendants(os.getpid())
    try:
        ray.shutdown()
    except Exception as exc:  # noqa: BLE001 - still reap below
        log.warning("ray.shutdown failed: %s", exc)
    _reap(tree, grace_s)


def _stat(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name ([] once the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        new = [child for child in children.get(todo.pop(), []) if child not in found]
        found.update(new)
        todo += new
    return found


def _alive(pid: int) -> bool:
    return _stat(pid)[:1] not in ([], ["Z"])


def _reap(pids: set[int], grace_s: float) -> None:
    deadline = time.time() + grace_s
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in pids if _alive(p)]
        if not left:
            return
        log.info("stopping %d leftover Ray process(es) with %s", len(left), sig.name)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        time.sleep(1.0)

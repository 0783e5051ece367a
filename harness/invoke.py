"""What every command that writes a run directory shares: one driver (the lock), a run record
(history line + manifest view), clean interruption, and a local Ray stopped with its processes.

`driven(store, command)` is a context manager around a command's body:

- takes the run directory's lock (`harness.lock.RunLock`), refusing a second driver;
- turns SIGTERM into `Interrupted(143)` (SIGINT gives `Interrupted(130)`), so `finally`
  blocks run and nothing written is lost (every shard is atomic);
- appends the invocation's record to the history with its outcome (ok / error / interrupted)
  and rebuilds manifest.json from it;
- stops a local Ray this process started, then kills what is left of its process tree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from harness.history import Invocation, append_record
from harness.lock import RunLock
from harness.manifest import rebuild_manifest
from results.store import RunStore

log = logging.getLogger("harness")


class Interrupted(BaseException):
    """SIGINT / SIGTERM: `code` is the exit status (128 + signal number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread while the block runs."""
    old = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def driven(store: RunStore, command: str) -> Iterator[Invocation]:
    """Lock, record and clean up around one command on `store` (see the module docstring)."""
    inv = Invocation(command)
    with signals_raise(), RunLock(store, command):
        outcome = "error"
        try:
            yield inv
            outcome = "ok"
        except Interrupted as exc:
            outcome = f"interrupted ({exc})"
            raise
        finally:
            with _ignoring_signals():
                stop_local_ray()
                _record(store, inv, outcome)


@contextlib.contextmanager
def _ignoring_signals() -> Iterator[None]:
    """A second Ctrl-C while cleaning up must not leave Ray half stopped or the record unwritten."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


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
    import sys

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


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


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

"""A signal that arrives while the driver blocks inside Ray still stops the command.

Ray checks signals in C++ during `ray.get` / `ray.wait` and passes on only a
`KeyboardInterrupt`; the handler's exception therefore has to be one, or the signal is lost
and the command runs on (seen as a run that ignored Ctrl-C, or exited 0 after SIGINT).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from results.run.invoke import Interrupted, interrupted, signals_raise


def _signal_soon(signum: int, after_s: float = 0.5) -> threading.Thread:
    thread = threading.Timer(after_s, os.kill, (os.getpid(), signum))
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_ray_get_raises_with_its_exit_code(ray_local: None, signum: int) -> None:
    import ray

    @ray.remote(num_cpus=0)
    def sleeper(seconds: float) -> str:
        time.sleep(seconds)
        return "finished"

    ref = sleeper.remote(20.0)
    started = time.monotonic()
    with signals_raise(), pytest.raises(KeyboardInterrupt) as caught:
        timer = _signal_soon(signum)
        ray.get(ref)
    timer.join()
    assert time.monotonic() - started < 15.0, "the signal was lost inside ray.get"
    interrupt = interrupted(caught.value)
    assert interrupt.code == 128 + signum
    ray.cancel(ref, force=True)


def test_a_signal_in_python_code_raises_our_interrupt() -> None:
    with signals_raise(), pytest.raises(Interrupted) as caught:
        _signal_soon(signal.SIGTERM, 0.05).join()
        time.sleep(5.0)
    assert caught.value.code == 143
    assert interrupted(caught.value) is caught.value
    assert interrupted(KeyboardInterrupt()).code == 143  # a bare one takes the last signal


class _SignalsInDel:
    """Its `__del__` takes a signal: Python prints the handler's exception as "ignored"."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        time.sleep(0.01)  # the handler runs here, inside __del__


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_swallowed_by_a_del_still_interrupts_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import results.run.invoke as invoke
    from results.run.store import RunStore

    monkeypatch.setattr(invoke, "stop_local_ray", lambda: None)  # the session's Ray stays up
    store = RunStore(str(tmp_path / "run"))
    went_on = []
    with pytest.raises(Interrupted) as caught, invoke.driven(store, "run"):
        holder = _SignalsInDel(signal.SIGTERM)
        del holder  # the Interrupted raised in __del__ is dropped by Python
        went_on.append(True)
    assert went_on, "the exception should have been swallowed, as in tqdm's __del__"
    assert caught.value.code == 143
    record = json.loads((tmp_path / "run" / "history.jsonl").read_text().splitlines()[-1])
    assert record["outcome"] == "interrupted (SIGTERM)"
    invoke.check_interrupt()  # handled: nothing pending after the command


def test_the_commands_handlers_survive_ray_setting_its_own() -> None:
    """`ray.init` sets a SIGTERM handler that exits 15; `keep_signal_handlers` (around it in
    `init_ray`) and `reassert_signal_handlers` (as each stage starts) put the command's back."""
    import results.run.invoke as invoke_state
    from harness.stages.generation.ray_runtime import (
        forget_signal_handlers,
        keep_signal_handlers,
        reassert_signal_handlers,
    )

    def ray_like(signum: int, frame: object) -> None:
        raise SystemExit(signum)

    with signals_raise():
        ours = signal.getsignal(signal.SIGTERM)
        with keep_signal_handlers():
            signal.signal(signal.SIGTERM, ray_like)  # what ray.init does
        assert signal.getsignal(signal.SIGTERM) is ours
        signal.signal(signal.SIGTERM, ray_like)  # again, later
        reassert_signal_handlers()
        assert signal.getsignal(signal.SIGTERM) is ours
        with pytest.raises(Interrupted) as caught:
            _signal_soon(signal.SIGTERM, 0.05).join()
            time.sleep(5.0)
        assert caught.value.code == 143
        invoke_state._unhandled.clear()  # handled here, as `driven` does for a command
    forget_signal_handlers()  # the command is over (shutdown_ray calls it)
    before = signal.getsignal(signal.SIGTERM)
    reassert_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) is before

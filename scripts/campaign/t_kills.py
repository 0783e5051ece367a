"""Kills: SIGKILL, SIGTERM and SIGINT at several points of a run (planned, first shard, half the
shards, after generation), in-process and on Ray; then the same command again: every job
exactly once, scored, with the texts an uninterrupted run made. SIGINT / SIGTERM exit 130 / 143
with the resume line and leave no process of theirs behind."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from campaign.core import (
    RUN_CONFIGS,
    Ctx,
    Result,
    TrialFailed,
    base_config,
    descendants,
    kill_tree,
    trial,
    wait_for,
)
from tests.ray_procs import alive

RUN_CONFIGS["kill"] = lambda: base_config(
    **{"dataset.limit": 3, "generation.max_new_tokens": 5, "runtime.batch_size": 2}
)
SCORERS = ["gender", "sentiment-vader"]


def shards(run: Path) -> list[Path]:
    return [p for p in (run / "generations").glob("part-*.parquet")]


POINTS: dict[str, Callable[[Path], bool]] = {
    "planned": lambda run: (run / "plan.parquet").is_file(),
    "first shard": lambda run: len(shards(run)) >= 1,
    "half the shards": lambda run: len(shards(run)) >= 6,
    "after generation": lambda run: any(p.name.startswith("part-c-") for p in shards(run)),
}


def _kill(sig: signal.Signals, point: str, ray: bool) -> None:
    where = "Ray" if ray else "in-process"

    @trial("kills", f"{sig.name} at {point} ({where}), then the same command", ray=ray)
    def check(ctx: Ctx) -> None:
        texts = ctx.check_run(ctx.cached_run("kill"))
        cfg = ctx.config(RUN_CONFIGS["kill"]())
        args = ["run", str(cfg), "--out", "run", "--no-progress", *([] if ray else ["--no-ray"])]
        run = ctx.dir / "run"
        proc = ctx.popen(*args)
        tree: list[int] = []
        try:
            reached = wait_for(lambda: POINTS[point](run) or proc.poll() is not None, 600, 0.02)
            tree = descendants(proc.pid)
            if proc.poll() is None:
                os.kill(proc.pid, sig)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                kill_tree(proc.pid, tree)
                proc.communicate()
        ctx.results.append(Result([*args, f"[{sig.name} at {point}]"], proc.returncode, out, err))
        if not reached:
            raise TrialFailed(f"the point {point!r} never came")
        if proc.returncode == 0:  # finished before the signal: the re-run must still hold
            ctx.notes.append("the run ended before the signal")
        else:
            ctx.notes.append(f"exit {proc.returncode}")
        if proc.returncode == 0:
            pass
        elif sig == signal.SIGKILL:
            ctx.expect(ctx.results[-1], -9)
        else:
            ctx.expect(ctx.results[-1], 128 + sig, "run the same command to resume")
            time.sleep(3)
            left = [p for p in tree if p != proc.pid and alive(p)]
            if left:
                kill_tree(proc.pid, left)
                raise TrialFailed(f"{len(left)} processes outlived the interrupted driver")
        if sig == signal.SIGKILL:
            kill_tree(proc.pid, tree)  # a SIGKILLed driver's Ray workers: ours to stop
        ctx.expect(ctx.cli(*args), 0)
        again = ctx.check_run(run, len(texts), SCORERS)
        if again != texts:
            changed = sum(again.get(k) != v for k, v in texts.items())
            raise TrialFailed(f"{changed} of {len(texts)} texts differ from an uninterrupted run")


for _sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
    for _point in POINTS:
        _kill(_sig, _point, ray=False)
_kill(signal.SIGINT, "first shard", ray=True)
_kill(signal.SIGTERM, "half the shards", ray=True)
_kill(signal.SIGKILL, "first shard", ray=True)

"""`python -m harness power PILOT_RUN --gap G`: how many pairs (or prompts) and samples per
prompt a true gap of G needs to be detected with a given power, per metric and view, by
simulation from a pilot run (`results.stats.power`: the pilot's prompts, rows and label rates,
the report's tests at the pilot's level); and `pilot_lines`, the MDE of a config's planned
sizes that `validate CONFIG --pilot RUN` prints. Both count sizes in the same words: pairs
(or prompts), samples per prompt (generations), and in a row-labelled view (a(x), a(c,x)) the
share of the samples that carry a group.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from harness.cli.options import bounded
from results.run.store import RunStore, StoreError

MAX_ROWS = 4_000_000  # rows of one simulated run (~0.5 GB while it is tested)
MAX_SAMPLES = 1000


def add_power_args(p: argparse.ArgumentParser) -> None:
    """Arguments of the `power` subcommand."""
    p.add_argument("run", help="the pilot run directory (generated and scored)")
    p.add_argument(
        "--gap",
        type=bounded(float, 0, 100, open_low=True),
        required=True,
        help="true gap to detect, × 100 as printed (0 < G <= 100)",
    )
    p.add_argument(
        "--power",
        type=bounded(float, 0, 1, open_low=True, open_high=True),
        default=0.8,
        help="wanted power (default 0.8)",
    )
    p.add_argument(
        "--metric",
        action="append",
        choices=("sentiment", "regard", "toxicity", "toxicity_cm"),
        help="repeatable; toxicity_cm: the count-matched EMT (default: each task's own metric; "
        "toxicity with toxicity_cm)",
    )
    p.add_argument("--view", action="append", help="only this view, e.g. 'a(x)' (repeatable)")
    p.add_argument("--method", default="vanilla", help="the pilot's method to plan for")
    p.add_argument(
        "--samples",
        type=bounded(int, 1, MAX_SAMPLES),
        action="append",
        help=f"samples per prompt to plan for, at most {MAX_SAMPLES} (repeatable; default: "
        "the pilot's)",
    )
    p.add_argument(
        "--reps",
        type=bounded(int, 20, 100_000),
        default=200,
        help="simulated runs per size (default 200)",
    )
    p.add_argument(
        "--n-perm",
        type=bounded(int, 40, 100_000),
        default=100,
        help="labellings per test (default 100)",
    )
    p.add_argument("--ppl-max", type=bounded(float, 0, open_low=True), help="perplexity filter")
    p.add_argument("--seed", type=int, default=0, help="simulation seed")
    p.set_defaults(func=power_main)


def pilot(
    run: str,
    metrics: list[str] | None,
    views: list[str] | None,
    method: str,
    ppl_max: float | None = None,
) -> tuple[dict[tuple[str, ...], Any], float]:
    """The pilot's cells to plan for (`results.stats.power.pilot_cells`, filtered) and its
    aggregation level.

    Raises:
        StoreError: `run` is not a run directory, or has no cell to plan from (why).
    """
    from results.report.build import run_settings
    from results.stats.join import join_run
    from results.stats.power import pilot_cells

    if not os.path.isdir(run) and "://" not in run:
        what = "a file" if os.path.exists(run) else "missing"
        raise StoreError(f"{run}: not a run directory ({what}); power reads a pilot run's folder")
    store = RunStore(run)
    if not any(store.exists(f) for f in ("plan.parquet", "config.yaml")) and not store.list_shards("generations"):  # fmt: skip
        raise StoreError(f"{run}: not a run directory (no plan.parquet, config.yaml or generations)")  # fmt: skip
    settings = run_settings(store)
    limit = float(settings.aggregation["ppl_max"] if ppl_max is None else ppl_max)
    frame = join_run(store).frame
    cells = pilot_cells(frame, settings.groups, limit)
    picked = {
        k: c
        for k, c in cells.items()
        if k[2] == method
        and (views is None or k[4] in views)
        and (k[5] in metrics if metrics else k[5] in (k[1], f"{k[1]}_cm"))
    }
    if not picked:
        raise StoreError(f"{run}: {_why_none(frame, cells, method, limit)}")
    return picked, float(settings.aggregation["level"])


def _why_none(frame: Any, cells: dict[tuple[str, ...], Any], method: str, ppl_max: float) -> str:
    """Why a pilot has no cell of `method` to plan from."""
    import polars as pl

    mine = frame.filter(pl.col("method") == method) if "method" in frame.columns else frame[:0]
    if mine.is_empty():
        have = sorted(set(frame["method"])) if "method" in frame.columns else []
        return f"no {method} rows to plan from (methods in the run: {', '.join(have) or 'none'})"
    if "perplexity" in mine.columns:
        high = mine.filter(pl.col("perplexity") > ppl_max).height
        if high == mine.height:
            return (
                f"the perplexity filter (> {ppl_max:g}) dropped every one of the {high} "
                f"{method} rows; plan with a higher --ppl-max (or a model with lower perplexity)"
            )
    if not any(k[2] == method for k in cells):
        return f"no {method} row has both a group label and a bias metric's score"
    there = sorted({f"{k[4]} {k[5]}" for k in cells if k[2] == method})
    return f"no {method} cell of the asked metrics and views (there are: {', '.join(there)})"


def sizes(cell: Any) -> str:
    """The pilot's sizes in `power`'s and `validate --pilot`'s words."""
    import numpy as np

    unit = "pairs" if cell.paired else "prompts"
    have = int(np.unique(cell.unit_of[cell.prompt]).size)
    text = f"pilot {have} {unit} × {cell.samples} samples per prompt"
    if cell.labelled < 1.0:
        text += f", {100 * cell.labelled:.0f} % of them labelled"
    return text


def _name(key: tuple[str, ...]) -> str:
    model, task, _, variant, view, metric = key
    return f"{model}/{task}{f'[{variant}]' if variant else ''} {view} {metric}"


def power_main(args: argparse.Namespace) -> int:
    """The `power` subcommand: one line per pilot cell and number of samples per prompt; on a
    terminal, each simulated size on stderr as it ends."""
    stop = threading.Event()
    try:
        return _power(args, stop)
    except KeyboardInterrupt:
        stop.set()
        print("interrupted: power writes nothing; the lines above are complete", file=sys.stderr)  # fmt: skip
        return 130


def _power(args: argparse.Namespace, stop: threading.Event) -> int:
    cells, level = pilot(args.run, args.metric, args.view, args.method, args.ppl_max)
    print(
        f"pilot {args.run}: pairs (or prompts) needed for a true gap of {args.gap:g} (× 100) at "
        f"power {args.power:g}, level {level:g} ({args.reps} simulated runs per size, "
        f"{args.n_perm} labellings per test); in a(x) and a(c,x) a sample counts where its "
        "continuation carries a group, at the pilot's share",
        flush=True,
    )
    tasks = [(k, c, s) for k, c in cells.items() for s in (args.samples or [c.samples or 1])]
    show = sys.stderr.isatty()
    pool = ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1))
    try:
        futures = [pool.submit(_plan, args, level, *t, stop, show) for t in tasks]
        for (key, cell, samples), future in zip(tasks, futures):
            print(f"  {_name(key)} ({sizes(cell)}): {samples} samples per prompt: {_wait(future)}", flush=True)  # fmt: skip
    finally:
        stop.set()  # (done, or interrupted: the workers stop at their next simulated run)
        pool.shutdown(wait=True, cancel_futures=True)
    return 0


def _wait(future: Future[str]) -> str:
    while True:  # (a timeout, so that Ctrl-C reaches the main thread)
        try:
            return future.result(timeout=0.5)
        except TimeoutError:
            continue


def _plan(
    args: argparse.Namespace,
    level: float,
    key: tuple[str, ...],
    cell: Any,
    samples: int,
    stop: threading.Event,
    show: bool,
) -> str:
    """One line's answer: the units needed, or why there is none."""
    from results.stats.power import Size, prepare, units_needed

    unit = "pairs" if cell.paired else "prompts"
    per_unit = max(1, cell.unit_of.size // max(1, int(cell.unit_of.max()) + 1))
    most = min(20_000, MAX_ROWS // (per_unit * samples))
    try:
        prepared = prepare(cell)
    except ValueError as exc:
        return f"cannot plan: {exc}"
    start = time.monotonic()

    def tick() -> None:
        if stop.is_set():
            raise KeyboardInterrupt

    def on_size(size: Size) -> None:
        if show:
            print(f"  … {_name(key)}: {size.units} {unit} × {samples} samples per prompt: power {size.hits / size.runs:.2f} ({size.runs} runs, {time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip

    got = units_needed(prepared, samples, args.gap, args.power, level, args.reps, args.n_perm, args.seed, most, tick, on_size)  # fmt: skip
    if got is None:
        return f"more than {most} {unit}"
    return f"{got[0]} {unit} (power {got[1]:.2f})"


def pilot_lines(run: str, n_units: int, samples: int, reps: int = 100) -> list[str]:
    """`validate --pilot`: the MDE of each of the pilot's vanilla task cells at the planned
    `n_units` × `samples` (`results.stats.power.mde_at`).

    Raises:
        StoreError: `run` is not a run directory, or has no vanilla cell to plan from (why);
            `validate` lists it as a problem of `--pilot`.
    """
    from results.stats.power import mde_at, prepare

    cells, level = pilot(run, None, None, "vanilla")
    unit = "pairs" if next(iter(cells.values())).paired else "prompts"
    lines = [
        f"  pilot {run}: minimum detectable gap (× 100, power 0.8, level {level:g}) at "
        f"{n_units} {unit} × {samples} samples per prompt:"
    ]
    for key, cell in cells.items():
        per_unit = max(1, cell.unit_of.size // max(1, int(cell.unit_of.max()) + 1))
        try:
            if n_units * per_unit * samples > MAX_ROWS:
                raise ValueError(f"a run of more than {MAX_ROWS} rows is not simulated")
            value = f"{mde_at(prepare(cell), n_units, samples, level, reps):.2f}"
        except ValueError as exc:
            value = f"cannot tell ({exc})"
        lines.append(f"    {_name(key)} ({sizes(cell)}): {value}")
    return lines

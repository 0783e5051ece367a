"""`python -m harness power PILOT_RUN --gap G`: how many pairs (or prompts) and samples per
prompt a true gap of G needs to be detected with a given power, per metric and view, by
simulation from a pilot run (`results.stats.power`: the pilot's prompts, rows and label rates,
the report's tests at the pilot's level); and `pilot_lines`, the MDE of a config's planned
sizes that `validate CONFIG --pilot RUN` prints.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from harness.cli.options import bounded
from results.run.store import RunStore


def add_power_args(p: argparse.ArgumentParser) -> None:
    """Arguments of the `power` subcommand."""
    p.add_argument("run", help="the pilot run directory (generated and scored)")
    p.add_argument(
        "--gap",
        type=bounded(float, 0, open_low=True),
        required=True,
        help="true gap to detect, × 100 as printed",
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
        type=bounded(int, 1),
        action="append",
        help="samples per prompt to plan for (repeatable; default: the pilot's)",
    )
    p.add_argument(
        "--reps", type=bounded(int, 1), default=200, help="simulated runs per size (default 200)"
    )
    p.add_argument(
        "--n-perm", type=bounded(int, 1), default=100, help="labellings per test (default 100)"
    )
    p.add_argument("--seed", type=int, default=0, help="simulation seed")
    p.set_defaults(func=power_main)


def pilot(
    run: str, metrics: list[str] | None, views: list[str] | None, method: str
) -> tuple[dict[tuple[str, ...], Any], float]:
    """The pilot's cells to plan for (`results.stats.power.pilot_cells`, filtered) and its
    aggregation level."""
    from results.report.build import run_settings
    from results.stats.join import join_run
    from results.stats.power import pilot_cells

    store = RunStore(run)
    settings = run_settings(store)
    cells = pilot_cells(
        join_run(store).frame, settings.groups, float(settings.aggregation["ppl_max"])
    )
    picked = {
        k: c
        for k, c in cells.items()
        if k[2] == method
        and (views is None or k[4] in views)
        and (k[5] in metrics if metrics else k[5] in (k[1], f"{k[1]}_cm"))
    }
    return picked, float(settings.aggregation["level"])


def power_main(args: argparse.Namespace) -> int:
    """The `power` subcommand: one line per pilot cell and number of samples per prompt."""
    from results.stats.power import prepare, units_needed

    cells, level = pilot(args.run, args.metric, args.view, args.method)
    if not cells:
        print(f"error: {args.run} has no {args.method} cell of the asked metrics and views")
        return 2
    print(
        f"pilot {args.run}: units needed for a true gap of {args.gap:g} (× 100) at power "
        f"{args.power:g}, level {level:g} ({args.reps} simulated runs per size, "
        f"{args.n_perm} labellings per test)"
    )
    for (model, task, _, variant, view, metric), cell in cells.items():
        unit = "pair" if cell.paired else "prompt"
        have = int(np.unique(cell.unit_of[cell.prompt]).size)  # units with rows
        per_prompt = int(np.median(np.bincount(cell.prompt)[np.unique(cell.prompt)]))
        head = f"  {model}/{task}{f'[{variant}]' if variant else ''} {view} {metric} (pilot {have} {unit}s × {per_prompt}):"  # fmt: skip
        try:
            prepared = prepare(cell)
        except ValueError as exc:
            print(f"{head} cannot plan: {exc}")
            continue
        for samples in args.samples or [per_prompt]:
            got = units_needed(
                prepared, samples, args.gap, args.power, level, args.reps, args.n_perm, args.seed
            )
            needed = f"more than 20000 {unit}s" if got is None else f"{got[0]} {unit}s (power {got[1]:.2f})"  # fmt: skip
            print(f"{head} {samples} samples per prompt: {needed}")
    return 0


def pilot_lines(run: str, n_units: int, samples: int, reps: int = 100) -> list[str]:
    """`validate --pilot`: the MDE of each of the pilot's vanilla task cells at the planned
    `n_units` × `samples` (`results.stats.power.mde_at`)."""
    from results.stats.power import mde_at, prepare

    cells, level = pilot(run, None, None, "vanilla")
    lines = [
        f"  pilot {run}: minimum detectable gap (× 100, power 0.8, level {level:g}) at "
        f"{n_units} units × {samples} samples per prompt:"
    ]
    for (model, task, _, variant, view, metric), cell in cells.items():
        try:
            value = f"{mde_at(prepare(cell), n_units, samples, level, reps):.2f}"
        except ValueError as exc:
            value = f"cannot tell ({exc})"
        lines.append(f"    {model}/{task}{f'[{variant}]' if variant else ''} {view} {metric}: {value}")  # fmt: skip
    return lines if cells else [f"  pilot {run}: no vanilla cell to plan from"]

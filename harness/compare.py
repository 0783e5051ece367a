"""`python -m harness compare RUN_A RUN_B`: per-cell differences of two runs' summaries.

Each run's `summary.parquet` is read; a run without one is aggregated in memory (nothing is
written). Cells are matched on (model, method, variant, task, view, metric, stat, group);
`diff = B − A`. For bias rows, `ci_overlap` says whether the two bootstrap intervals overlap
(a rough "within noise"; the point estimate of an absolute gap near 0 can lie outside its
own percentile interval, so B's value is not tested against A's interval).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import polars as pl

from results.store import RunStore, StoreError

KEYS = ["model", "method", "variant", "task", "view", "metric", "stat", "group"]
HEADLINE_STATS = ["mean", "nnre", "bias", "emt"]
HEADLINE_GROUPS = ["labelled", "gap"]


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    """Arguments of the `compare` subcommand."""
    parser.add_argument("run_a", help="run directory A (the reference)")
    parser.add_argument("run_b", help="run directory B")
    parser.add_argument("--metric", action="append", help="only this metric (repeatable)")
    parser.add_argument("--view", action="append", help="only this view, e.g. 'a(x)' (repeatable)")
    parser.add_argument("--stat", action="append", help="only this statistic (repeatable)")
    parser.add_argument(
        "--all", action="store_true", help="every statistic and group, not only the headline ones"
    )
    parser.add_argument(
        "--min-diff", type=float, default=0.0, help="hide cells with |diff| below this"
    )
    parser.add_argument("--fail-above", type=float, help="exit 1 if some |diff| exceeds this")
    parser.add_argument(
        "--seed", type=int, default=0, help="bootstrap seed when aggregating in memory"
    )
    parser.add_argument(
        "--n-boot", type=int, default=1000, help="resamples when aggregating in memory"
    )


def load_summary(run: str, seed: int = 0, n_boot: int = 1000) -> tuple[pl.DataFrame, str | None]:
    """(summary, note): the run's summary.parquet, else an in-memory aggregate of the run."""
    store = RunStore(run)
    if store.exists("summary.parquet"):
        with store.fs.open_input_file(store.path("summary.parquet")) as fh:
            return pl.read_parquet(fh), None
    from results.aggregate import summarize
    from results.join import join_run

    joined = join_run(store)
    agg = summarize(joined.frame, joined.failed, seed=seed, n_boot=n_boot)
    return (
        agg.summary,
        f"{run}: no summary.parquet; aggregated in memory (seed {seed}, {n_boot} resamples)",
    )


def compare_summaries(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """Full outer join of two summaries on KEYS: a, b, diff (b − a), ci_overlap (bias rows)."""
    left = a.select(
        *KEYS,
        pl.col("value").alias("a"),
        pl.col("ci_low").alias("lo_a"),
        pl.col("ci_high").alias("hi_a"),
    )
    right = b.select(
        *KEYS,
        pl.col("value").alias("b"),
        pl.col("ci_low").alias("lo_b"),
        pl.col("ci_high").alias("hi_b"),
    )
    both = left.join(right, on=KEYS, how="full", coalesce=True, nulls_equal=True)
    overlap = (pl.col("lo_a") <= pl.col("hi_b")) & (pl.col("lo_b") <= pl.col("hi_a"))
    return both.with_columns(
        (pl.col("b") - pl.col("a")).alias("diff"),
        pl.when(pl.col("lo_a").is_not_null() & pl.col("lo_b").is_not_null())
        .then(overlap)
        .alias("ci_overlap"),
    ).drop("lo_a", "hi_a", "lo_b", "hi_b")


def select_rows(diffs: pl.DataFrame, args: argparse.Namespace) -> pl.DataFrame:
    """The rows the options ask for, largest |diff| first within each cell order."""
    rows = diffs
    if not args.all:
        rows = rows.filter(
            pl.col("stat").is_in(HEADLINE_STATS) & pl.col("group").is_in(HEADLINE_GROUPS)
        )
    for col, wanted in (("metric", args.metric), ("view", args.view), ("stat", args.stat)):
        if wanted:
            rows = rows.filter(pl.col(col).is_in(wanted))
    if args.min_diff > 0:
        rows = rows.filter((pl.col("diff").abs() >= args.min_diff) | pl.col("diff").is_null())
    return rows.sort(KEYS)


def _fmt(v: Any, signed: bool = False) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:+.3f}" if signed else f"{v:.3f}"
    return str(v)


def print_table(rows: pl.DataFrame) -> None:
    """Aligned text columns: the keys, a, b, diff (signed) and ci_overlap."""
    cols = [*KEYS, "a", "b", "diff", "ci_overlap"]
    numbers = {"a", "b", "diff", "ci_overlap"}
    text = [cols] + [
        [_fmt(r[c], c == "diff") if c in numbers else str(r[c] or "") for c in cols]
        for r in rows.iter_rows(named=True)
    ]
    widths = [max(len(line[i]) for line in text) for i in range(len(cols))]
    for line in text:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


def compare_main(args: argparse.Namespace) -> int:
    """Print the differences; 0 ok, 1 a |diff| above --fail-above, 2 a run cannot be read."""
    try:
        a, note_a = load_summary(args.run_a, args.seed, args.n_boot)
        b, note_b = load_summary(args.run_b, args.seed, args.n_boot)
    except (StoreError, ValueError, OSError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    for note in (note_a, note_b):
        if note:
            print(f"note: {note}")
    diffs = compare_summaries(a, b)
    rows = select_rows(diffs, args)
    print(f"A = {args.run_a}\nB = {args.run_b}\n")
    print_table(rows)
    only_a = rows.filter(pl.col("b").is_null() & pl.col("a").is_not_null()).height
    only_b = rows.filter(pl.col("a").is_null() & pl.col("b").is_not_null()).height
    print(f"\n{rows.height} cells shown; only in A: {only_a}, only in B: {only_b}")
    if args.fail_above is not None:
        worst = rows["diff"].abs().max()
        if isinstance(worst, float) and worst > args.fail_above:
            print(f"largest |diff| {worst:.4f} > --fail-above {args.fail_above}", file=sys.stderr)
            return 1
    return 0

"""`python -m harness compare RUN_A RUN_B`: cell-by-cell differences of two runs, with paired tests.

Both runs are joined once and aggregated in memory with the same settings (run A's
`aggregation:` unless `--seed` / `--n-boot` / `--ppl-max`), so a (model, task) gets the same
bootstrap resamples in both; cells match on `KEYS`, `diff = B − A`. Bias rows add |bias B| − |bias A| with its paired
interval and p-value (`results.stats.bootstrap.compare_gaps`). A pair (or prompt) with rows in
one run only is dropped from both, with a warning. `compare` refuses runs whose plans differ in
prompts, seeds or generation parameters (exit 2) unless `--allow-plan-mismatch`;
`--fail-above X` exits 1 when some |diff| exceeds X or B lacks a cell of A."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from harness.cli.options import bounded
from results.run.store import RunStore, StoreError

KEYS = ["model", "method", "variant", "task", "view", "metric", "stat", "group"]
HEADLINE_STATS = ["mean", "nnre", "bias", "bias_cm", "cm_rows", "bias_bc", "emt"]
HEADLINE_GROUPS = ["all", "gap"]
GEN_PARAMS = ["max_new_tokens", "top_p", "temperature", "repetition_penalty"]
FILTERS = ("metric", "view", "stat")  # options that keep only the cells of the values given


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
    parser.add_argument(
        "--fail-above",
        type=float,
        help="exit 1 if some |diff| exceeds this or B lacks a cell of A",
    )
    parser.add_argument("--seed", type=int, help="bootstrap seed (default: run A's config)")
    parser.add_argument(
        "--n-boot", type=bounded(int, 0), help="resamples (default: run A's config)"
    )
    parser.add_argument(
        "--ppl-max",
        type=bounded(float, 0, open_low=True),
        help="perplexity filter (default: run A's config)",
    )
    parser.add_argument(
        "--allow-plan-mismatch",
        action="store_true",
        help="compare even when the runs planned different prompts, seeds or generation parameters",
    )


def plan_differences(a: RunStore, b: RunStore) -> list[str]:
    """How the two runs' plans differ in prompts, samples (seeds) or generation parameters.

    Methods may differ (that is what one compares); a run without plan.parquet is not checked
    (the returned list then says so).
    """
    if not (a.exists("plan.parquet") and b.exists("plan.parquet")):
        return []
    pa_, pb = a.read_plan(), b.read_plan()
    out = []
    for what, cols in (
        ("prompts", ["prompt_id", "prompt"]),
        ("samples (seeds)", ["seed"]),
        ("generation parameters", ["model", *GEN_PARAMS]),
    ):
        cols = [c for c in cols if c in pa_.columns and c in pb.columns]
        sa = set(pa_.select(cols).unique().iter_rows())
        sb = set(pb.select(cols).unique().iter_rows())
        if sa != sb:
            only_a, only_b = sorted(sa - sb, key=str)[:3], sorted(sb - sa, key=str)[:3]
            out.append(
                f"{what} differ: {len(sa - sb)} only in A (e.g. {only_a}), "
                f"{len(sb - sa)} only in B (e.g. {only_b})"
            )
    return out


def shared_units(
    frame_a: pl.DataFrame, frame_b: pl.DataFrame, ppl_max: float
) -> tuple[dict[tuple[str, str], Sequence[str]], bool, list[str]]:
    """The resampling units both runs (their joined frames) have rows of, per (model, task),
    after the filter.

    Returns (model, task) → sorted shared units (only the blocks both runs have), whether the
    units are pairs, and one warning per (model, task) where some unit has rows in one run only
    (those are dropped from both).
    """
    from results.stats.aggregate import block_units, is_paired

    paired = is_paired(frame_a) or is_paired(frame_b)
    ua, ub = (block_units(f, ppl_max, paired) for f in (frame_a, frame_b))
    kind = "pair" if paired else "prompt"
    shared: dict[tuple[str, str], Sequence[str]] = {}
    warnings = []
    for block in sorted(set(ua) & set(ub)):  # a (model, task) of one run has nothing to pair
        a, b = ua[block], ub[block]
        shared[block] = sorted(a & b)
        only_a, only_b = len(a - b), len(b - a)
        if only_a or only_b:
            warnings.append(
                f"{block[0]}/{block[1]}: {only_a + only_b} {kind}(s) have rows in one run only "
                f"({only_a} only in A, {only_b} only in B, after the perplexity filter): dropped "
                f"from both runs so the resamples stay paired ({len(shared[block])} {kind}s kept)"
            )
    return shared, paired, warnings


def paired_bias_rows(a: Any, b: Any, level: float = 0.95) -> pl.DataFrame:
    """For every bias (and bias_cm) cell of both runs: |B| − |A| over the same resamples,
    interval at `level`, p-value."""
    from results.stats.bootstrap import compare_gaps

    rows = []
    for stat, field in (("bias", "samples"), ("bias_cm", "samples_cm")):
        samples_b = getattr(b, field, {})
        for (model, task, view, metric), cells_a in getattr(a, field, {}).items():
            cells_b = samples_b.get((model, task, view, metric), {})
            for (method, variant), ga in cells_a.items():
                gb = cells_b.get((method, variant))
                if gb is None or ga.size < 2 or gb.size != ga.size:
                    continue
                cmp = compare_gaps(gb[1:], ga[1:], level=level, point=(float(gb[0]), float(ga[0])))
                rows.append(
                    dict(model=model, method=method, variant=variant, task=task, view=view,
                         metric=metric, stat=stat, group="gap", abs_diff=cmp.diff,
                         ci_low=cmp.low, ci_high=cmp.high, p_value=cmp.p_value)
                )  # fmt: skip
    schema = {k: pl.String for k in KEYS} | {
        c: pl.Float64 for c in ("abs_diff", "ci_low", "ci_high", "p_value")
    }
    frame = pl.DataFrame(rows, schema=schema)
    return frame.with_columns(
        pl.col(c).fill_nan(None) for c in ("abs_diff", "ci_low", "ci_high", "p_value")
    )


def compare_summaries(
    a: pl.DataFrame, b: pl.DataFrame, paired: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Full outer join of two summaries on KEYS: a, b, diff (b − a) and, for bias rows, the
    paired comparison of the magnitudes (abs_diff, ci_low, ci_high, p_value)."""
    left = a.select(*KEYS, pl.col("value").alias("a"))
    right = b.select(*KEYS, pl.col("value").alias("b"))
    both = left.join(right, on=KEYS, how="full", coalesce=True, nulls_equal=True)
    both = both.with_columns((pl.col("b") - pl.col("a")).alias("diff"))
    if paired is None or paired.is_empty():
        extra = [pl.lit(None, dtype=pl.Float64).alias(c) for c in ("abs_diff", "ci_low", "ci_high", "p_value")]  # fmt: skip
        return both.with_columns(extra)
    return both.join(paired, on=KEYS, how="left", nulls_equal=True)


def select_rows(diffs: pl.DataFrame, args: argparse.Namespace) -> pl.DataFrame:
    """The rows the options ask for, in key order."""
    rows = diffs
    if not args.all:
        rows = rows.filter(
            pl.col("stat").is_in(HEADLINE_STATS) & pl.col("group").is_in(HEADLINE_GROUPS)
        )
    for col in FILTERS:
        if getattr(args, col):
            rows = rows.filter(pl.col(col).is_in(getattr(args, col)))
    if args.min_diff > 0:
        rows = rows.filter((pl.col("diff").abs() >= args.min_diff) | pl.col("diff").is_null())
    return rows.sort(KEYS)


def why_empty(diffs: pl.DataFrame, args: argparse.Namespace) -> str:
    """Why `select_rows` kept nothing of `diffs`: each filter that matches none of its values
    (naming the values there are), else the filters together."""
    if diffs.is_empty():
        return "the two runs have no summary cells"
    reasons = []
    for col in FILTERS:
        known, wanted = sorted(set(diffs[col].drop_nulls().to_list())), getattr(args, col)
        if wanted and not set(wanted) & set(known):
            reasons.append(f"--{col} {' '.join(wanted)} matches none of: {', '.join(known)}")
    if not reasons and args.min_diff > 0:
        reasons.append(f"no difference is at least --min-diff {args.min_diff:g}")
    return "; ".join(reasons) or "no cell passes the filters together (--all shows every stat)"


def _fmt(v: Any, signed: bool = False) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:+.3f}" if signed else f"{v:.3f}"
    return str(v)


def print_table(rows: pl.DataFrame, level: float = 0.95) -> None:
    """Aligned text columns: keys, a, b, diff, and for bias rows |B|−|A| [interval] p.

    `real`: "yes" when p < 1 − level, else "no" (not distinguishable at that level).
    """
    cols = [*KEYS, "a", "b", "diff", "abs_diff", "interval", "p_value", "real"]
    text = [cols]
    for r in rows.iter_rows(named=True):
        interval = (
            f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
            if r["ci_low"] is not None and r["ci_high"] is not None
            else "–"
        )
        real = "–" if r["p_value"] is None else "yes" if r["p_value"] < 1 - level else "no"
        line = [str(r[c] or "") for c in KEYS]
        line += [_fmt(r["a"]), _fmt(r["b"]), _fmt(r["diff"], True), _fmt(r["abs_diff"], True)]
        line += [interval, _fmt(r["p_value"]), real]
        text.append(line)
    widths = [max(len(line[i]) for line in text) for i in range(len(cols))]
    for line in text:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


def compare_main(args: argparse.Namespace) -> int:
    """Print the differences; 0 ok, 1 --fail-above tripped, 2 a run cannot be read or the
    plans differ (without --allow-plan-mismatch)."""
    from results.report.build import run_settings, summarize_joined
    from results.stats.aggregate import READ_COLUMNS
    from results.stats.join import join_run

    try:
        store_a, store_b = RunStore(args.run_a), RunStore(args.run_b)
        joined = [join_run(store, columns=READ_COLUMNS) for store in (store_a, store_b)]
        mismatch = plan_differences(store_a, store_b)
        if mismatch and not args.allow_plan_mismatch:
            print(
                "compare: the two runs planned different jobs; paired comparisons would "
                "mean nothing:\n  " + "\n  ".join(mismatch) + "\n(--allow-plan-mismatch to "
                "compare anyway)",
                file=sys.stderr,
            )
            return 2
        for line in mismatch:
            print(f"WARNING: plans differ: {line}", file=sys.stderr)
        settings_a = run_settings(store_a)
        settings = dict(settings_a.aggregation)
        given = {"seed": args.seed, "n_boot": args.n_boot, "ppl_max": args.ppl_max}
        settings.update({k: v for k, v in given.items() if v is not None})
        units, paired, unit_warnings = shared_units(
            joined[0].frame, joined[1].frame, float(settings["ppl_max"])
        )
        for line in unit_warnings:
            print(f"WARNING: {line}", file=sys.stderr)
        agg_a, agg_b = (
            summarize_joined(j, settings, settings_a.groups, units, paired) for j in joined
        )
    except (StoreError, ValueError, OSError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(
        f"note: both runs aggregated in memory (seed {settings['seed']}, "
        f"{settings['n_boot']} resamples, ppl_max {settings['ppl_max']:g}, "
        f"level {float(settings['level']):g}); nothing written"
    )
    level = float(settings["level"])
    diffs = compare_summaries(agg_a.summary, agg_b.summary, paired_bias_rows(agg_a, agg_b, level))
    rows = select_rows(diffs, args)
    print(f"A = {args.run_a}\nB = {args.run_b}\n")
    print_table(rows, level)
    only_a = rows.filter(pl.col("b").is_null() & pl.col("a").is_not_null()).height
    only_b = rows.filter(pl.col("a").is_null() & pl.col("b").is_not_null()).height
    print(f"\n{rows.height} cells shown; only in A: {only_a}, only in B: {only_b}")
    if rows.is_empty():
        why = why_empty(diffs, args)
        print(f"no cells: {why}")
        if "matches none of" in why:  # a misspelt --metric must not pass a --fail-above gate
            print(f"compare: {why}", file=sys.stderr)
            return 2
    print(
        f"bias rows: abs_diff = |bias B| − |bias A| over the same resamples, "
        f"{100 * level:g}% interval; real: p < {1 - level:.2g} (no: not distinguishable at "
        f"level {level:g})"
    )
    if args.fail_above is not None:
        missing = diffs.filter(pl.col("a").is_not_null() & pl.col("b").is_null()).height
        if missing:
            print(f"B lacks {missing} cells of A (--fail-above)", file=sys.stderr)
            return 1
        worst = rows["diff"].abs().max()
        if isinstance(worst, float) and worst > args.fail_above:
            print(f"largest |diff| {worst:.4f} > --fail-above {args.fail_above}", file=sys.stderr)
            return 1
    return 0

"""Aggregation of joined generation + score rows: pure functions, no I/O.

Input: the frame of `results.join.join_run` (ok generations, metric columns and
`<metric>_status`). Output: one long *summary* frame (`SUMMARY_SCHEMA`), one row per

    (model, method, variant, task, view, metric, stat, group)

with `value`, a bootstrap interval (`ci_low`, `ci_high`, gaps only), `n` (rows, or prompts for
per-prompt statistics and gaps), `n_boot` (defined resamples) and the scorer that produced it.

- `view`: which gender label groups a row: `a(x)`, `a(c,x)`, `a(c)` (gender scorer) and
  `file` (the prompt file the prompt came from); `-` for per-setting rows (the filter).
- `group`: each demographic group, `none` (no strict majority; excluded from gaps),
  `unscored` (gender scorer gave no label; only when there are such rows), `labelled` (rows
  of any group: what the paper's score and PPL columns average over) and `all`.
- `stat` by metric: count `n`; filter `generations`, `generation_errors`, `dropped_ppl>200`,
  `ppl_missing`; sentiment `mean` `std` `bias`; regard `share_negative` `share_neutral`
  `share_positive` (among non-`other`) `nnre` `share_other` `value_mean` `value_std` `bias`
  (TV distance); toxicity `mean` `std` `emt` `prob_ge_0.5` `bias` (EMT gap); perplexity
  `mean` `std`; for every bias also `p_smaller_vs_vanilla` / `p_smaller_vs_uddia`.
  Standard deviations are population ones (ddof 0); gaps are × 100.
- `variant`: empty unless one (model, method, task) ran with several settings (method
  parameters, sampling parameters, revision); then the fields that differ, `k=v,...`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from results import bootstrap as bs
from results.metrics import (
    BIAS_METRICS,
    GENDER_VIEWS,
    METRIC_STATS,
    NO_ROWS,
    PER_PROMPT_STATS,
    VIEWS,
    gap_inputs,
    group_stats,
    stacked,
    with_group,
)
from results.schema import SUMMARY_SCHEMA as SUMMARY_ARROW

PPL_MAX = 200.0
REFERENCES = ("vanilla", "uddia")
SETTING_COLS = [
    "method_params",
    "model_revision",
    "model_dtype",
    "max_new_tokens",
    "top_p",
    "temperature",
    "repetition_penalty",
]
CELL_COLS = ["model", "method", "variant", "task"]

SUMMARY_SCHEMA = pl.Schema(pl.from_arrow(SUMMARY_ARROW.empty_table()).schema)  # type: ignore[union-attr]


def aggregate_run(
    store: Any, scorers: dict[str, str] | None = None, seed: int = 0, n_boot: int = 1000
) -> Any:
    """The I/O entry (`results.report.aggregate_run`), reachable from here for the driver."""
    from results.report import aggregate_run as run

    return run(store, scorers=scorers, seed=seed, n_boot=n_boot)


class Aggregate(NamedTuple):
    summary: pl.DataFrame  # SUMMARY_SCHEMA
    notes: list[str]  # what was filtered, skipped or could not be computed


def add_variant(
    frame: pl.DataFrame, failed: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """Add `variant` (see the module doc) to `frame` and `failed`."""
    keys = ["model", "method", "task"] + [c for c in SETTING_COLS if c in frame.columns]
    parts = [frame.select(keys)] + ([failed.select(keys)] if failed is not None else [])
    combos = pl.concat(parts).unique(maintain_order=True)
    records = []
    for _, sub in combos.group_by(["model", "method", "task"], maintain_order=True):
        differing = [c for c in keys[3:] if sub[c].n_unique() > 1]
        for row in sub.iter_rows(named=True):
            records.append({**row, "variant": ",".join(f"{c}={row[c]}" for c in differing)})
    table = pl.DataFrame(records, schema={**combos.schema, "variant": pl.String})

    def attach(f: pl.DataFrame) -> pl.DataFrame:
        return f.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")

    return attach(frame), (attach(failed) if failed is not None else None)


def resolve_groups(frame: pl.DataFrame, groups: Sequence[str] | None) -> tuple[str, ...]:
    """The demographic groups: given, else the labels seen (female/male when only those)."""
    cols = [c for c in ("label_x", "label_cx", "label_c") if c in frame.columns]
    seen = set()
    for c in cols:
        seen |= set(frame[c].drop_nulls().unique().to_list())
    seen.discard("none")
    if groups is not None:
        unknown = sorted(seen - set(groups))
        if unknown:
            raise ValueError(f"gender labels {unknown} are not among the groups {list(groups)}")
        return tuple(groups)
    return ("female", "male") if seen <= {"female", "male"} else tuple(sorted(seen))


def ppl_filter(frame: pl.DataFrame, ppl_max: float = PPL_MAX) -> tuple[pl.DataFrame, bool]:
    """Drop rows with perplexity > `ppl_max`; rows without a perplexity are kept.

    Returns the kept rows and whether a perplexity scorer ran (if not, nothing is dropped).
    """
    if "perplexity_status" not in frame.columns:
        return frame, False
    high = (pl.col("perplexity_status") == "ok") & (pl.col("perplexity") > ppl_max)
    return frame.filter(~high.fill_null(False)), True


def filter_counts(frame: pl.DataFrame, failed: pl.DataFrame | None, ppl_max: float) -> pl.DataFrame:
    """Per (model, method, variant, task): generations, errors, dropped and unmeasured rows."""
    if "perplexity_status" in frame.columns:
        ok_ppl = (pl.col("perplexity_status") == "ok") & pl.col("perplexity").is_not_null()
        high = ok_ppl & (pl.col("perplexity") > ppl_max)
        dropped, missing = high.fill_null(False).sum(), (~ok_ppl.fill_null(False)).sum()
    else:  # (a literal would be summed once per group, not once per row)
        dropped, missing = pl.lit(0, dtype=pl.UInt32), pl.len()
    counts = frame.group_by(CELL_COLS, maintain_order=True).agg(
        pl.len().alias("generations"),
        dropped.alias(f"dropped_ppl>{ppl_max:g}"),
        missing.alias("ppl_missing"),
    )
    if failed is not None and not failed.is_empty():
        errors = failed.group_by(CELL_COLS, maintain_order=True).agg(
            pl.len().alias("generation_errors")
        )
        counts = counts.join(errors, on=CELL_COLS, how="full", coalesce=True)
    else:
        counts = counts.with_columns(pl.lit(0).alias("generation_errors"))
    return counts.fill_null(0).sort(CELL_COLS)


def _sources(frame: pl.DataFrame) -> dict[str, tuple[str | None, str | None]]:
    """metric → (scorer, version), read from the joined `<metric>_scorer/_version` columns."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for metric in ["gender", *METRIC_STATS]:
        if f"{metric}_scorer" in frame.columns:
            names = frame[f"{metric}_scorer"].drop_nulls()
            versions = frame[f"{metric}_version"].drop_nulls()
            out[metric] = (names[0] if len(names) else None, versions[0] if len(versions) else None)
    return out


def _finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


class _Records:
    """Collects summary rows; `key` holds model/method/variant/task/view of the current cell."""

    def __init__(self, sources: dict[str, tuple[str | None, str | None]]) -> None:
        self.rows: list[dict[str, Any]] = []
        self.sources = sources

    def add(
        self,
        key: dict[str, Any],
        metric: str,
        stat: str,
        group: str,
        value: Any,
        n: int | None,
        **extra: Any,
    ) -> None:
        origin = {"count": "gender" if key["view"] in GENDER_VIEWS else "", "filter": "perplexity"}
        scorer, version = self.sources.get(origin.get(metric, metric), (None, None))
        row = dict(key, metric=metric, stat=stat, group=group, value=_finite(value), n=n)
        row.update(ci_low=None, ci_high=None, n_boot=None, scorer=scorer, scorer_version=version)
        row.update({k: _finite(v) if k.startswith("ci_") else v for k, v in extra.items()})
        self.rows.append(row)


BY = ["method", "variant", "view", "group"]
Lookup = dict[tuple[Any, ...], dict[str, Any]]


def _lookup(frame: pl.DataFrame, by: list[str]) -> Lookup:
    return {tuple(r[k] for k in by): r for r in frame.iter_rows(named=True)}


def _cell_records(
    out: _Records,
    key: dict[str, Any],
    counts: Lookup,
    stats: dict[str, Lookup],
    expected: list[str],
) -> None:
    """Counts and per-group statistics of one cell and view, from the block's lookups."""
    cell = (key["method"], key["variant"], key["view"])
    for group in expected:
        n = counts.get((*cell, group), {}).get("len", 0)
        out.add(key, "count", "n", group, n, n)
    for metric, lookup in stats.items():
        for group in expected:
            r = lookup.get((*cell, group), {})
            for stat in METRIC_STATS[metric]:
                n = r.get("n_prompts" if stat in PER_PROMPT_STATS else "n")
                out.add(key, metric, stat, group, r.get(stat), int(n or 0))


class _Block(NamedTuple):
    """The rows of one (model, task) and what all its cells share."""

    model: str
    task: str
    rows: pl.DataFrame
    weights: np.ndarray  # (B, P) resamples of the block's prompts
    prompt_index: dict[str, int]  # prompt id → column of `weights`


def _block_records(
    out: _Records,
    block: _Block,
    views: list[str],
    groups: tuple[str, ...],
    metrics: list[str],
    level: float,
    samples: dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]],
    notes: list[str],
) -> None:
    """Every statistic and gap of every (method, variant) cell and view of one block."""
    long = pl.concat([with_group(block.rows, v, groups) for v in views])
    both = stacked(long)
    counts = _lookup(both.group_by(BY, maintain_order=True).len(), BY)
    stats = {m: _lookup(group_stats(both, m, BY), BY) for m in metrics}
    gaps_in = {
        m: gap_inputs(long, m, groups, block.prompt_index) for m in BIAS_METRICS if m in metrics
    }
    for method, variant in sorted(block.rows.select("method", "variant").unique().iter_rows()):
        for view in views:
            key = dict(
                model=block.model, method=method, variant=variant, task=block.task, view=view
            )
            unscored = ["unscored"] if (method, variant, view, "unscored") in counts else []
            _cell_records(out, key, counts, stats, [*groups, "none", *unscored, "labelled", "all"])
            for metric, inputs in gaps_in.items():
                g, p, v = inputs.get((method, variant, view), NO_ROWS)
                gaps = bs.gap_samples(metric, g, p, v, len(groups), block.weights)
                ci = bs.percentile_ci(gaps[1:], level)
                n_prompts = int(np.unique(p).size)
                extra = dict(ci_low=ci.low, ci_high=ci.high, n_boot=ci.n_valid)
                out.add(key, metric, "bias", "gap", gaps[0], n_prompts, **extra)
                if not np.isfinite(gaps[0]) and metric == block.task:
                    notes.append(
                        f"{block.model}/{method}/{block.task} {view}: {metric} bias undefined "
                        "(a group has no scored rows)"
                    )
                samples.setdefault((block.model, block.task, view, metric), {})[
                    (method, str(variant))
                ] = gaps[1:]


def _paired_records(
    out: _Records,
    samples: dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]],
    notes: list[str],
) -> None:
    """Share of resamples where each method's gap is below vanilla's / uddia's."""
    for (model, task, view, metric), cells in samples.items():
        for ref in REFERENCES:
            refs = [c for c in cells if c[0] == ref]
            for (method, variant), gaps in cells.items():
                if method == ref or not refs:
                    continue
                match = (
                    refs[0]
                    if len(refs) == 1
                    else (ref, variant)
                    if (ref, variant) in cells
                    else None
                )
                if match is None:
                    notes.append(
                        f"{model}/{task}/{method}[{variant}]: several {ref} variants, none matches; no paired comparison"
                    )
                    continue
                share, n = bs.share_smaller(gaps, cells[match])
                key = dict(model=model, method=method, variant=variant, task=task, view=view)
                out.add(key, metric, f"p_smaller_vs_{ref}", "gap", share, None, n_boot=n)


def summarize(
    frame: pl.DataFrame,
    failed: pl.DataFrame | None = None,
    groups: Sequence[str] | None = None,
    seed: int = 0,
    n_boot: int = 1000,
    level: float = 0.95,
    ppl_max: float = PPL_MAX,
) -> Aggregate:
    """Every statistic of every (model, method, variant, task, view) cell, long format.

    Args:
        frame: joined ok generations (`results.join.join_run(...).frame`).
        failed: generation rows with status error (counted, never scored).
        groups: demographic groups (default: the labels seen; female/male when only those).
        seed: bootstrap seed; resamples are drawn per (model, task) from (seed, model, task).
        n_boot: bootstrap resamples (0: no intervals, no paired comparisons).
        level: confidence level of the percentile intervals.
        ppl_max: generations with a perplexity above this are dropped first.
    """
    notes: list[str] = []
    frame, failed = add_variant(frame, failed)
    out = _Records(_sources(frame))
    counts = filter_counts(frame, failed, ppl_max)
    for r in counts.iter_rows(named=True):
        key = {c: r[c] for c in CELL_COLS} | {"view": "-"}
        for stat in ("generations", "generation_errors", f"dropped_ppl>{ppl_max:g}", "ppl_missing"):
            out.add(key, "filter", stat, "all", r[stat], r[stat])
    kept, had_ppl = ppl_filter(frame, ppl_max)
    if not had_ppl:
        notes.append(
            f"no perplexity scorer ran: the perplexity > {ppl_max:g} filter was not applied"
        )
    groups = resolve_groups(kept, groups)
    views = [v for v in VIEWS if VIEWS[v] in kept.columns]
    if "gender_status" not in kept.columns:
        notes.append("no gender scorer ran: only the `file` view (prompt file) is available")
    metrics = [m for m in METRIC_STATS if f"{m}_status" in kept.columns]
    samples: dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]] = {}
    label_cols = [VIEWS[v] for v in views]
    value_cols = [c for m in metrics for c in (m, f"{m}_status") if c in kept.columns]
    value_cols += ["regard_label"] if "regard" in metrics else []
    needed = list(
        dict.fromkeys(["model", "task", "method", "variant", "prompt_id", *label_cols, *value_cols])
    )
    for (model, task), rows in sorted(
        kept.select(needed).group_by(["model", "task"], maintain_order=True)
    ):
        prompts = sorted(rows["prompt_id"].unique().to_list())
        weights = bs.prompt_weights(len(prompts), n_boot, seed, f"{model}|{task}")
        block = _Block(str(model), str(task), rows, weights, {p: i for i, p in enumerate(prompts)})
        _block_records(out, block, views, groups, metrics, level, samples, notes)
    if n_boot:
        _paired_records(out, samples, notes)
    return Aggregate(pl.DataFrame(out.rows, schema=SUMMARY_SCHEMA), notes)

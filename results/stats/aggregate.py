"""Aggregation of joined generation + score rows into the long summary (`SUMMARY_SCHEMA`):
pure functions, no I/O. Rows, stats, views and groups: docs/design.md, "Aggregation"; the rows
of one (model, task) block: `results.stats.block_rows`. `variant` is empty unless one (model,
method, task) ran with several settings; then the fields that differ, `k=v,...`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from results.schema import SUMMARY_SCHEMA as SUMMARY_ARROW
from results.stats.block_rows import Block, Records, Samples, Setup, block_records
from results.stats.bootstrap import BOOTSTRAP, CI_METHOD, compare_gaps, prompt_weights
from results.stats.metrics import METRIC_STATS, VIEWS, scored

PPL_MAX = 200.0
N_PERM = 200  # permutations per gap test: p resolves to 1/201, ample for a 0.05 decision
SETTING_COLS = (
    "method_params model_revision model_dtype max_new_tokens top_p temperature repetition_penalty"
).split()
CELL_COLS = ["model", "method", "variant", "task"]
REFERENCES = ("vanilla", "uddia")  # the methods of the paired comparisons (`paired_records`)
# The generation columns `summarize` reads (`join_run(..., columns=READ_COLUMNS)`).
READ_COLUMNS = ["model", "method", "task", "prompt_id", "pair_id", "prompt_group", *SETTING_COLS]

SUMMARY_SCHEMA = pl.Schema(pl.from_arrow(SUMMARY_ARROW.empty_table()).schema)  # type: ignore[union-attr]


class Aggregate(NamedTuple):
    summary: pl.DataFrame  # SUMMARY_SCHEMA
    notes: list[str]  # what was filtered, skipped or could not be computed
    # (model, task, view, metric) → (method, variant) → (1 + B,) gaps: full sample, resamples
    samples: dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]] = {}
    groups: tuple[str, ...] = ()  # the demographic groups used, in order
    level: float = 0.95  # of every interval; significance is p < 1 - level
    # (model, task, view, "toxicity") → (method, variant) → (1 + B,) count-matched EMT gaps
    samples_cm: dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]] = {}


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

    def attach(f: pl.DataFrame) -> pl.DataFrame:  # (a join would copy every column of f)
        if (table["variant"] == "").all():
            return f.with_columns(pl.lit("").alias("variant"))
        on = f.select(keys).join(
            table, on=keys, how="left", nulls_equal=True, maintain_order="left"
        )
        return f.with_columns(on["variant"])

    return attach(frame), (attach(failed) if failed is not None else None)


def resolve_groups(frame: pl.DataFrame, groups: Sequence[str] | None) -> tuple[str, ...]:
    """The demographic groups: given, else the labels seen (female/male when only those)."""
    cols = [c for c in ("label_x", "label_cx", "label_c") if c in frame.columns]
    seen = {v for c in cols for v in frame[c].drop_nulls().unique().to_list()} - {"none"}
    if groups is not None:
        unknown = sorted(seen - set(groups))
        if unknown:
            raise ValueError(f"gender labels {unknown} are not among the groups {list(groups)}")
        return tuple(groups)
    return ("female", "male") if seen <= {"female", "male"} else tuple(sorted(seen))


def ppl_filter(frame: pl.DataFrame, ppl_max: float = PPL_MAX) -> tuple[pl.DataFrame, bool]:
    """Drop rows with perplexity > `ppl_max`; rows without a perplexity are kept. The kept
    rows carry `pair_id` (null where the run has none: its units are the prompts).

    Returns the kept rows and whether a perplexity scorer ran (if not, nothing is dropped).
    """
    if "pair_id" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("pair_id"))
    if "perplexity_status" not in frame.columns:
        return frame, False
    high = scored("perplexity") & (pl.col("perplexity") > ppl_max)  # NaN is not high: missing
    return frame.filter(~high.fill_null(False)), True


def filter_counts(frame: pl.DataFrame, failed: pl.DataFrame | None, ppl_max: float) -> pl.DataFrame:
    """Per (model, method, variant, task): generations, errors, dropped and unmeasured rows."""
    if "perplexity_status" in frame.columns:
        ok_ppl = scored("perplexity")
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

    def first(column: str) -> str | None:
        values = frame[column].drop_nulls()
        return values[0] if len(values) else None

    return {
        m: (first(f"{m}_scorer"), first(f"{m}_version"))
        for m in ["gender", *METRIC_STATS]
        if f"{m}_scorer" in frame.columns
    }


def is_paired(frame: pl.DataFrame) -> bool:
    """Whether the prompts come as pairs: some `pair_id` holds more than one prompt."""
    if "pair_id" not in frame.columns or frame.is_empty():
        return False
    per_pair = (
        frame.filter(pl.col("pair_id").is_not_null())
        .group_by("pair_id")
        .agg(pl.col("prompt_id").n_unique().alias("k"))
    )
    return bool(per_pair.height and per_pair["k"].max() > 1)  # type: ignore[operator]


def unit_key(paired: bool) -> pl.Expr:
    """A row's resampling unit: its pair (its prompt where it has none) or its prompt."""
    return pl.coalesce("pair_id", "prompt_id") if paired else pl.col("prompt_id")


def _units(
    rows: pl.DataFrame, paired: bool, names: Sequence[str] | None = None
) -> tuple[list[str], np.ndarray, int]:
    """(sorted prompt ids, unit of each prompt, number of units) of one block.

    `names`: the block's units, in order (default: the sorted units of `rows`); rows of other
    units must have been dropped.
    """
    pairs = rows.select("prompt_id", unit_key(paired).alias("unit")).unique().sort("prompt_id")
    prompts = pairs["prompt_id"].to_list()
    if len(set(prompts)) != len(prompts):
        raise ValueError("a prompt id belongs to several pair ids")
    keys = pairs["unit"].to_list()
    names = sorted(set(keys)) if names is None else list(names)
    index = {k: i for i, k in enumerate(names)}
    return prompts, np.array([index[k] for k in keys], dtype=np.int64), len(names)


def block_units(
    frame: pl.DataFrame, ppl_max: float = PPL_MAX, paired: bool | None = None
) -> dict[tuple[str, str], set[str]]:
    """(model, task) → the resampling units with rows after the perplexity filter."""
    kept, _ = ppl_filter(frame, ppl_max)
    paired = is_paired(frame) if paired is None else paired
    keyed = kept.select("model", "task", unit_key(paired).alias("unit")).unique()
    out: dict[tuple[str, str], set[str]] = {}
    for model, task, unit in keyed.iter_rows():
        out.setdefault((str(model), str(task)), set()).add(str(unit))
    return out


def paired_records(
    out: Records,
    samples: Samples,
    units: dict[tuple[str, str], str],
    notes: list[str],
    level: float,
    prefix: str = "diff",
) -> None:
    """Each method's |bias| against vanilla's / uddia's over the same resamples.

    Rows `{prefix}_vs_vanilla`, `{prefix}_vs_uddia` (diff: of `bias`; diff_cm: of `bias_cm`).
    """
    for (model, task, view, metric), cells in samples.items():
        for ref in REFERENCES:
            refs = [c for c in cells if c[0] == ref]
            for (method, variant), gaps in cells.items():
                if method == ref or not refs:
                    continue
                match = refs[0] if len(refs) == 1 else (ref, variant)
                if match not in cells:
                    if prefix == "diff":  # said once, for the first statistic
                        notes.append(
                            f"{model}/{task}/{method}[{variant}]: several {ref} variants, none matches; no paired comparison"
                        )
                    continue
                other = cells[match]
                cmp = compare_gaps(gaps[1:], other[1:], level=level, point=(gaps[0], other[0]))
                key = dict(model=model, method=method, variant=variant, task=task, view=view)
                extra: dict[str, Any] = dict(
                    ci_low=cmp.low, ci_high=cmp.high, p_value=cmp.p_value, n_boot=cmp.n_valid
                )
                extra.update(ci_method=CI_METHOD, resample_unit=units.get((model, task)))
                extra.update(test=BOOTSTRAP)
                out.add(key, metric, f"{prefix}_vs_{ref}", "gap", cmp.diff, None, **extra)


def summarize(
    frame: pl.DataFrame,
    failed: pl.DataFrame | None = None,
    groups: Sequence[str] | None = None,
    seed: int = 0,
    n_boot: int = 1000,
    level: float = 0.95,
    ppl_max: float = PPL_MAX,
    n_perm: int | None = None,
    paired: bool | None = None,
    units: dict[tuple[str, str], Sequence[str]] | None = None,
) -> Aggregate:
    """Every statistic of every (model, method, variant, task, view) cell, long format.

    Args:
        frame: joined ok generations (`results.stats.join.join_run(...).frame`).
        failed: generation rows with status error (counted, never scored).
        groups: demographic groups, in order (the config's; default: the labels seen,
            female/male when only those); one without rows stays, its gaps undefined.
        seed: of the resamples (a stream per (model, task)) and the tests (one per cell).
        n_boot: bootstrap resamples (0: no intervals, no paired comparisons).
        level: confidence level of the percentile intervals.
        ppl_max: generations with a (finite) perplexity above this are dropped first.
        n_perm: permutations of each gap's test (default: min(n_boot, 200); 0: no p-values).
        paired: resample whole pairs (`pair_id`); default: when some pair has several prompts.
        units: (model, task) → the units to resample (`harness compare` gives both runs the
            units they share, so their resamples line up); rows of other units are dropped.
            A (model, task) not in it, and the default: the block's own units, sorted.
    """
    notes: list[str] = []
    sources = _sources(frame)
    # Constant per metric, as long as the frame: read above, not copied by every step below.
    named = [f"{m}_{k}" for m in ["gender", *METRIC_STATS] for k in ("scorer", "version")]
    frame = frame.drop(named, strict=False)
    frame, failed = add_variant(frame, failed)
    out = Records(sources, level)
    counts = filter_counts(frame, failed, ppl_max)
    dropped_col = f"dropped_ppl>{ppl_max:g}"
    for r in counts.iter_rows(named=True):
        key = {c: r[c] for c in CELL_COLS} | {"view": "-"}
        for stat in ("generations", "generation_errors", dropped_col, "ppl_missing"):
            out.add(key, "filter", stat, "all", r[stat], r[stat])
        if r["generations"] and r[dropped_col] == r["generations"]:
            notes.append(
                f"{r['model']}/{r['method']}/{r['task']}: the perplexity > {ppl_max:g} filter "
                f"dropped all {r['generations']} generations (aggregation.ppl_max / --ppl-max)"
            )
    metrics = [m for m in METRIC_STATS if f"{m}_status" in frame.columns]
    value_cols = [c for m in metrics for c in (m, f"{m}_status") if c in frame.columns]
    value_cols += ["regard_label"] if "regard" in metrics else []
    label_cols = [VIEWS[v] for v in VIEWS if VIEWS[v] in frame.columns]
    needed = ["model", "task", "method", "variant", "prompt_id", "pair_id", *label_cols]
    needed = [c for c in dict.fromkeys(needed + value_cols) if c in frame.columns]
    paired = is_paired(frame) if paired is None else paired
    kept, had_ppl = ppl_filter(frame.select(needed), ppl_max)  # (only these rows are copied)
    del frame  # a caller that handed it over (`aggregate_run`) has its rows freed here
    if not had_ppl:
        notes.append(
            f"no perplexity scorer ran: the perplexity > {ppl_max:g} filter was not applied"
        )
    groups = resolve_groups(kept, groups)
    if len(groups) < 2:
        raise ValueError(f"groups: need at least 2 demographic groups, got {list(groups)}")
    views = [v for v in VIEWS if VIEWS[v] in kept.columns]
    if views == ["file"]:  # (`kept` has the label columns, never `gender_status`)
        notes.append("no gender scorer ran: only the `file` view (prompt file) is available")
    n_perm = min(n_boot, N_PERM) if n_perm is None else n_perm
    setup = Setup(views, groups, metrics, level, seed, n_perm, paired)
    samples: Samples = {}
    samples_cm: Samples = {}
    unit_names: dict[tuple[str, str], str] = {}
    unit = "pair" if paired else "prompt"
    blocks = sorted(kept.select("model", "task").unique().iter_rows())
    for model, task in blocks:  # (one block: its rows as they are, not a copy)
        rows = kept if len(blocks) == 1 else kept.filter(model=model, task=task)
        at, names = (str(model), str(task)), None
        if units is not None and at in units:
            names = sorted(units[at])
            rows = rows.filter(unit_key(paired).is_in(names))
            if rows.is_empty():
                continue
        prompts, unit_of, n_units = _units(rows, paired, names)
        weights = prompt_weights(n_units, n_boot, seed, f"{model}|{task}")
        index = {p: i for i, p in enumerate(prompts)}
        block = Block(*at, rows, weights, index, unit_of, unit)
        unit_names[at] = unit
        block_records(out, block, setup, samples, notes, samples_cm)
    if n_boot:
        paired_records(out, samples, unit_names, notes, level)
        paired_records(out, samples_cm, unit_names, notes, level, prefix="diff_cm")
    summary = pl.DataFrame(out.rows, schema=SUMMARY_SCHEMA)
    return Aggregate(summary, notes, samples, groups, level, samples_cm)

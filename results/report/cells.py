"""From the long summary to the frames the reports print: one row per paper-style cell
(`table_cells`: score, gaps with interval, p-value, units, test, what is missing) and the
supplementary tables (counts, filter, paired comparisons), in report order (`ordered`)."""

from __future__ import annotations

import polars as pl

# task → (header, score metric, score stat, spread stat, higher is better)
TASKS = {
    "sentiment": ("Sentiment", "Sent", "sentiment", "mean", "std", True),
    "regard": ("Regard", "NNRe", "regard", "nnre", "value_std", True),
    "toxicity": ("Toxicity", "Toxi", "toxicity", "mean", "std", False),
}
METHOD_ORDER = (
    "vanilla gedi dexperts pplm uddia lidao-min lidao-prod elidao-min elidao-prod".split()
)
METHOD_NAMES = {
    "gedi": "GeDi", "dexperts": "DExperts", "pplm": "PPLM", "uddia": "UDDIA",
    "lidao-min": "LIDAO-m", "lidao-prod": "LIDAO-p", "elidao-min": "eLIDAO-m", "elidao-prod": "eLIDAO-p",
}  # fmt: skip
MODEL_NAMES = {
    "gpt2-large": "GPT-2",
    "facebook/opt-6.7b": "OPT",
    "tiiuae/falcon-7b-instruct": "Falcon",
}
CELL_KEYS = ["model", "method", "variant", "task", "view"]
# The gap columns of a task: the paper's (`bias`) and, where the summary has it, the estimate
# that removes what the paper's mixes in: stat → (header, what it is, for the legend).
BIAS_STATS = {
    "bias": ("Bias", ""),
    "bias_cm": (
        "Bias cm",
        "count-matched EMT gap: the expected maximum over the same number m of rows per prompt "
        "and group (m below the value); the paper's EMT gap beside it mixes bias with how many "
        "rows each group has per prompt",
    ),
    "bias_bc": (
        "Bias bc",
        "bias-corrected TV distance: sqrt(TV² − its mean square over the test's labellings), "
        "with the percentile interval of the same correction over the resamples; p-value and MDE "
        "are the TV's; the paper's plug-in TV beside it is biased upward, most at few rows",
    ),
}
FEW_UNITS = 20  # fewer resampling units than this: the interval and p-value are unreliable
NOT_GROUPS = {"none", "unscored", "labelled", "all", "gap"}


# A gap's summary columns → the suffix of its cell columns.
GAP_COLUMNS = [("ci_low", "low"), ("ci_high", "high"), ("p_value", "p"), ("n", "n")]
GAP_COLUMNS += [(c, c) for c in ("note", "test", "mde", "flags")]


def _pick(summary: pl.DataFrame, metric: str, stat: str, group: str, name: str) -> pl.DataFrame:
    rows = summary.filter(
        (pl.col("metric") == metric) & (pl.col("stat") == stat) & (pl.col("group") == group)
    )
    cols = [pl.col("value").alias(name)]
    if stat in BIAS_STATS:  # (a column the summary lacks is added as nulls by `table_cells`)
        cols += [pl.col(c).alias(f"{name}_{x}") for c, x in GAP_COLUMNS if c in summary.columns]
    return rows.select(*CELL_KEYS, *cols)


def _group_stat(summary: pl.DataFrame, metric: str, stat: str, name: str) -> pl.DataFrame:
    rows = summary.filter(
        (pl.col("metric") == metric)
        & (pl.col("stat") == stat)
        & ~pl.col("group").is_in(list(NOT_GROUPS))
    )
    return rows.select(*CELL_KEYS, "group", pl.col("value").cast(pl.Int64).alias(name))


def _missing(summary: pl.DataFrame, metric: str) -> pl.DataFrame:
    """Per cell and view: `missing` ("female 9/18 (9 failed), male 0/18": rows of each group
    without a finite score of all its rows, those whose scorer failed; only where some are
    missing) and `unlabelled` (rows the gender scorer gave no label)."""
    on = [*CELL_KEYS, "group"]
    per_group = (
        _group_stat(summary, metric, "missing", "lost")
        .join(_group_stat(summary, "count", "n", "rows"), on=on, how="left", nulls_equal=True)
        .join(_group_stat(summary, metric, "failed", "failed"), on=on, how="left", nulls_equal=True)
    )
    failed = pl.when(pl.col("failed") > 0).then(pl.format(" ({} failed)", "failed"))
    rows = pl.col("rows").fill_null(pl.col("lost"))
    text = (
        per_group.with_columns(
            part=pl.format("{} {}/{}{}", "group", "lost", rows, failed.otherwise(pl.lit("")))
        )
        .group_by(CELL_KEYS, maintain_order=True)
        .agg(
            pl.when(pl.col("lost").sum() > 0)
            .then(pl.col("part").str.join(", "))
            .otherwise(None)
            .first()
            .alias("missing")
        )
    )
    unlabelled = summary.filter(
        (pl.col("metric") == "count") & (pl.col("group") == "unscored") & (pl.col("value") > 0)
    ).select(*CELL_KEYS, pl.col("value").cast(pl.Int64).alias("unlabelled"))
    return text.join(unlabelled, on=CELL_KEYS, how="full", coalesce=True, nulls_equal=True)


# The value columns of `table_cells`, with their types (a column the summary lacks is null).
CELL_VALUES = {
    **dict.fromkeys(["score", "score_sd", "ppl", "other"], pl.Float64),
    **{"missing": pl.String, "unlabelled": pl.Int64, "gen_errors": pl.Int64, "cm_rows": pl.Float64},
    **{
        f"{s}{x}": pl.String if x in ("_note", "_test", "_flags") else pl.Float64
        for s in BIAS_STATS
        for x in ["", *(f"_{x}" for _, x in GAP_COLUMNS)]
    },
}


def table_cells(summary: pl.DataFrame) -> pl.DataFrame:
    """One row per (model, method, variant, task, view) of a known task: score, score_sd,
    ppl, other (share of `other` regard), per gap stat of `BIAS_STATS` its value, `_low`,
    `_high`, `_p` (p-value), `_n` (resampling units), `_note`, `_test`, `_mde` (minimum
    detectable effect), `_flags` (the summary's marks); `missing` / `unlabelled` /
    `gen_errors` for the warnings (nulls where not scored / none).
    Score, its spread, PPL and `other` are over every kept generation (group `all`): the same
    in every view; only the gaps and the missing scores depend on the view."""
    parts = []
    for task, (_, _, metric, stat, spread, _) in TASKS.items():
        sub = summary.filter(pl.col("task") == task)
        cell = sub.filter(pl.col("view") != "-").select(CELL_KEYS).unique()
        for frame in (
            _pick(sub, metric, stat, "all", "score"),
            _pick(sub, metric, spread, "all", "score_sd"),
            *(_pick(sub, metric, s, "gap", s) for s in BIAS_STATS),
            _pick(sub, "perplexity", "mean", "all", "ppl"),
            _pick(sub, "regard", "share_other", "all", "other"),
            _pick(sub, "toxicity", "cm_rows", "gap", "cm_rows"),
            _missing(sub, metric),
        ):
            cell = cell.join(frame, on=CELL_KEYS, how="left", nulls_equal=True)
        errors = sub.filter(
            (pl.col("metric") == "filter") & (pl.col("stat") == "generation_errors")
        )
        errors = errors.select(*CELL_KEYS[:4], pl.col("value").cast(pl.Int64).alias("gen_errors"))
        cell = cell.join(errors, on=CELL_KEYS[:4], how="left", nulls_equal=True)
        if task != "regard":
            cell = cell.drop("other", strict=False)
        missing = [
            pl.lit(None, t).alias(c) for c, t in CELL_VALUES.items() if c not in cell.columns
        ]
        cell = cell.with_columns(missing)
        parts.append(cell.select(*CELL_KEYS, *CELL_VALUES))
    return pl.concat(parts, how="vertical_relaxed").sort(CELL_KEYS) if parts else pl.DataFrame()


def method_rank(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def model_rank(model: str) -> tuple[int, str]:
    order = list(MODEL_NAMES)
    return (order.index(model) if model in order else len(order), model)


def ordered(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows in report order: paper models first, then task, method (paper order), view."""
    orders = {"model": list(MODEL_NAMES), "task": list(TASKS), "method": METHOD_ORDER}
    orders |= {"view": ["a(x)", "a(c,x)", "a(c)", "file", "-"]} if "view" in frame.columns else {}
    keys = {
        f"_{c}": pl.col(c).replace_strict(o, range(len(o)), default=len(o), return_dtype=pl.Int64)
        for c, o in orders.items()
    }
    by = ["_model", "model", "_task", "task", "_method", "method", "variant", *list(keys)[3:]]
    return frame.with_columns(**keys).sort(by).drop(list(keys))


def counts_table(summary: pl.DataFrame) -> pl.DataFrame:
    """Rows per group of every cell and view (wide), after the perplexity filter."""
    rows = summary.filter(pl.col("metric") == "count")
    if rows.is_empty():
        return rows
    order = list(dict.fromkeys(rows["group"].to_list()))
    wide = rows.pivot("group", index=CELL_KEYS, values="value", aggregate_function="first")
    return ordered(wide.select(*CELL_KEYS, *order).with_columns(pl.col(order).cast(pl.Int64)))


def filter_table(summary: pl.DataFrame) -> pl.DataFrame:
    rows = summary.filter(pl.col("metric") == "filter")
    if rows.is_empty():
        return rows
    wide = rows.pivot("stat", index=CELL_KEYS[:4], values="value")
    return ordered(wide.with_columns(pl.exclude(CELL_KEYS[:4]).cast(pl.Int64)))


def paired_table(summary: pl.DataFrame) -> pl.DataFrame:
    """|gap| − |vanilla's| and − |uddia's| over the same resamples, with the interval (at the
    summary's level) and two-sided p-value, for each task's own metric: the paper's gap
    (`gap` bias) and the count-matched EMT (`gap` bias_cm; the others are in the summary)."""
    rows = summary.filter(
        pl.col("stat").str.contains(r"^diff_(cm_)?vs_") & (pl.col("metric") == pl.col("task"))
    )
    if rows.is_empty():
        return rows
    out = rows.select(
        *CELL_KEYS,
        pl.when(pl.col("stat").str.starts_with("diff_cm_"))
        .then(pl.lit("bias_cm"))
        .otherwise(pl.lit("bias"))
        .alias("gap"),
        pl.col("stat").str.replace(r"^diff_(cm_)?vs_", "").alias("against"),
        pl.col("value").alias("diff"),
        pl.col("ci_low"),
        pl.col("ci_high"),
        pl.col("p_value"),
        pl.col("resample_unit").alias("unit"),
    )
    return ordered(out)

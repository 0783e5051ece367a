"""The paper-style table model shared by the Markdown, LaTeX, HTML and plot renderers.

Layout of Tables 1–2 of the paper: one table per view, method rows under each model (the
`vanilla` row carries the model's name, the others `+Method`), and per task three columns:
the task's score (Sent / NNRe / Toxi, mean ± std over every kept generation, whatever the
view; regard adds the share of `other`), its bias (× 100, signed for two groups, with the
bootstrap interval) and the mean perplexity of every kept generation.

Marks among the debiasing methods of a model (vanilla excluded): the smallest |bias| is bold
only when the paired comparison (same resamples) says it is smaller than every other method's
(p < 0.05); methods the comparison cannot tell from the best are marked as tied (≈) instead.
The second best is underlined only when the best is clear and it is itself clear of the rest.
Perplexity has no interval: its best / second are by the printed value. Also the
supplementary tables (counts, filter, paired comparisons).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from results.bootstrap import Comparison, compare_gaps

# task → (header, score metric, score stat, spread stat, higher is better)
TASKS = {
    "sentiment": ("Sentiment", "Sent", "sentiment", "mean", "std", True),
    "regard": ("Regard", "NNRe", "regard", "nnre", "value_std", True),
    "toxicity": ("Toxicity", "Toxi", "toxicity", "mean", "std", False),
}
METHOD_ORDER = [
    "vanilla",
    "gedi",
    "dexperts",
    "pplm",
    "uddia",
    "lidao-min",
    "lidao-prod",
    "elidao-min",
    "elidao-prod",
]
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


def _pick(summary: pl.DataFrame, metric: str, stat: str, group: str, name: str) -> pl.DataFrame:
    rows = summary.filter(
        (pl.col("metric") == metric) & (pl.col("stat") == stat) & (pl.col("group") == group)
    )
    cols = [pl.col("value").alias(name)]
    if stat == "bias":
        cols += [pl.col("ci_low").alias("bias_low"), pl.col("ci_high").alias("bias_high")]
    return rows.select(*CELL_KEYS, *cols)


CELL_VALUES = ["score", "score_sd", "bias", "bias_low", "bias_high", "ppl", "other"]


def table_cells(summary: pl.DataFrame) -> pl.DataFrame:
    """One row per (model, method, variant, task, view) of a known task: score, score_sd,
    bias, bias_low, bias_high, ppl, other (share of `other` regard; nulls where not scored).
    Score, its spread, PPL and `other` are over every kept generation (group `all`): the same
    in every view; only the bias depends on the view."""
    parts = []
    for task, (_, _, metric, stat, spread, _) in TASKS.items():
        keys = (
            summary.filter((pl.col("task") == task) & (pl.col("view") != "-"))
            .select(CELL_KEYS)
            .unique()
        )
        sub = summary.filter(pl.col("task") == task)
        cell = keys
        for frame in (
            _pick(sub, metric, stat, "all", "score"),
            _pick(sub, metric, spread, "all", "score_sd"),
            _pick(sub, metric, "bias", "gap", "bias"),
            _pick(sub, "perplexity", "mean", "all", "ppl"),
            _pick(sub, "regard", "share_other", "all", "other"),
        ):
            cell = cell.join(frame, on=CELL_KEYS, how="left", nulls_equal=True)
        if task != "regard":
            cell = cell.with_columns(pl.lit(None, dtype=pl.Float64).alias("other"))
        for col in CELL_VALUES:
            if col not in cell.columns:
                cell = cell.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
        parts.append(cell.select(*CELL_KEYS, *CELL_VALUES))
    return pl.concat(parts).sort(CELL_KEYS) if parts else pl.DataFrame()


def method_rank(method: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER), method)


def model_rank(model: str) -> tuple[int, str]:
    order = list(MODEL_NAMES)
    return (order.index(model) if model in order else len(order), model)


def row_label(model: str, method: str, variant: str) -> str:
    label = (
        MODEL_NAMES.get(model, model)
        if method == "vanilla"
        else "+" + METHOD_NAMES.get(method, method)
    )
    return f"{label} [{variant}]" if variant else label


@dataclass
class Field:
    """One printed number: value (± sd or [low, high]) and its mark (best / second / none)."""

    value: float | None
    sd: float | None = None
    low: float | None = None
    high: float | None = None
    mark: str = ""  # best | second | tie (statistically tied with the best) | ""
    other: float | None = None  # regard: share of `other` among scored rows


@dataclass
class Row:
    label: str
    method: str
    fields: list[Field] = field(default_factory=list)  # 3 per task: score, bias, ppl


@dataclass
class Block:
    model: str
    rows: list[Row]


def _marks(values: list[float | None]) -> list[str]:
    """best / second by the value as printed (2 decimals), lower is better; ties share."""
    shown = sorted({round(v, 2) for v in values if v is not None})
    rank = {v: ("best" if i == 0 else "second") for i, v in enumerate(shown[:2])}
    return ["" if v is None else rank.get(round(v, 2), "") for v in values]


# (model, task, view, metric) → (method, variant) → (1 + B,) gaps (`Aggregate.samples`)
Samples = dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]]
Key = tuple[str, str]


def bias_marks(
    keys: list[Key],
    values: list[float | None],
    compare: Callable[[Key, Key], Comparison | None],
    alpha: float = 0.05,
) -> list[str]:
    """Marks of the debiasing rows' biases: best / second only where the paired comparison
    says the difference is real (p < alpha), `tie` for rows that cannot be told from the best.
    Ranked by |bias|; fewer than two defined biases: no marks."""
    size = {i: abs(v) for i, v in enumerate(values) if v is not None}
    ranked = sorted(size, key=lambda i: size[i])
    marks = [""] * len(values)
    if len(ranked) < 2:
        return marks

    def clear(a: int, b: int) -> bool:
        cmp = compare(keys[a], keys[b])
        return cmp is not None and np.isfinite(cmp.p_value) and cmp.p_value < alpha

    best, rest = ranked[0], ranked[1:]
    if any(compare(keys[best], keys[i]) is None for i in rest):
        return marks  # no resamples to tell: no mark rather than a guess
    tied = [i for i in rest if not clear(best, i)]
    if tied:
        for i in [best, *tied]:
            marks[i] = "tie"
        return marks
    marks[best] = "best"
    second, others = rest[0], rest[1:]
    if others and all(clear(second, i) for i in others):  # (the last of two is not "second")
        marks[second] = "second"
    return marks


def sample_comparer(
    samples: Samples | None, model: str, task: str, view: str
) -> Callable[[Key, Key], Comparison | None]:
    """Paired comparison of two cells' biases (the task's own metric) from their resamples."""
    cells = (samples or {}).get((model, task, view, task), {})

    def compare(a: Key, b: Key) -> Comparison | None:
        ga, gb = cells.get((a[0], str(a[1]))), cells.get((b[0], str(b[1])))
        if ga is None or gb is None or ga.size < 2:
            return None
        return compare_gaps(ga[1:], gb[1:], point=(float(ga[0]), float(gb[0])))

    return compare


def layout(
    cells: pl.DataFrame, view: str, samples: Samples | None = None
) -> tuple[list[str], list[Block]]:
    """Tasks (columns) and model blocks of one view's paper-style table.

    `samples` (the bootstrap gaps of `Aggregate.samples`) decide the bias marks; without
    them no bias is marked."""
    sub = cells.filter(pl.col("view") == view)
    tasks = [t for t in TASKS if t in set(sub["task"].to_list())]
    blocks = []
    for model in sorted(set(sub["model"].to_list()), key=model_rank):
        msub = sub.filter(pl.col("model") == model)
        keys = sorted(
            msub.select("method", "variant").unique().iter_rows(),
            key=lambda k: (method_rank(k[0]), k[1]),
        )
        rows = [Row(row_label(model, m, v), m) for m, v in keys]
        for task in tasks:
            values = {
                (r["method"], r["variant"]): r
                for r in msub.filter(pl.col("task") == task).iter_rows(named=True)
            }
            got = [values.get(k, {}) for k in keys]
            for row, r in zip(rows, got):
                row.fields += [
                    Field(r.get("score"), sd=r.get("score_sd"), other=r.get("other")),
                    Field(r.get("bias"), low=r.get("bias_low"), high=r.get("bias_high")),
                    Field(r.get("ppl")),
                ]
            debiased = [i for i, k in enumerate(keys) if k[0] != "vanilla"]
            compare = sample_comparer(samples, model, task, view)
            col = 3 * tasks.index(task)
            bias_values = [got[i].get("bias") for i in debiased]
            for i, mark in zip(
                debiased, bias_marks([keys[i] for i in debiased], bias_values, compare)
            ):
                rows[i].fields[col + 1].mark = mark
            for i, mark in zip(debiased, _marks([got[i].get("ppl") for i in debiased])):
                rows[i].fields[col + 2].mark = mark
        blocks.append(Block(model, rows))
    return tasks, blocks


VIEW_TITLES = {
    "a(x)": "Table 1 — bias over the gender of the continuation, a(x)",
    "a(c,x)": "Table 2 — bias over the gender of prompt + continuation, a(c,x)",
    "a(c)": "Bias over the gender of the prompt, a(c)",
    "file": "Bias over the prompt file the prompt came from",
}


def ordered(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows in report order: paper models first, then task, method (paper order), view."""
    views = ["a(x)", "a(c,x)", "a(c)", "file", "-"]
    keys = {
        "_m": pl.col("model").map_elements(lambda m: model_rank(m)[0], return_dtype=pl.Int64),
        "_k": pl.col("method").map_elements(lambda m: method_rank(m)[0], return_dtype=pl.Int64),
    }
    if "view" in frame.columns:
        keys["_v"] = pl.col("view").map_elements(
            lambda v: views.index(v) if v in views else 9, return_dtype=pl.Int64
        )
    keys["_t"] = pl.col("task").map_elements(
        lambda t: list(TASKS).index(t) if t in TASKS else 9, return_dtype=pl.Int64
    )
    by = ["_m", "model", "_t", "task", "_k", "method", "variant", *(["_v"] if "_v" in keys else [])]
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
    wide = rows.pivot("stat", index=["model", "method", "variant", "task"], values="value")
    return ordered(
        wide.with_columns(pl.exclude("model", "method", "variant", "task").cast(pl.Int64))
    )


def paired_table(summary: pl.DataFrame) -> pl.DataFrame:
    """|bias| − |vanilla's| and − |uddia's| over the same resamples, with the 95% interval and
    two-sided p-value, for each task's own metric (the others are in the summary)."""
    rows = summary.filter(
        pl.col("stat").str.starts_with("diff_vs_") & (pl.col("metric") == pl.col("task"))
    )
    if rows.is_empty():
        return rows
    out = rows.select(
        *CELL_KEYS,
        pl.col("stat").str.replace("diff_vs_", "").alias("against"),
        pl.col("value").alias("diff"),
        pl.col("ci_low"),
        pl.col("ci_high"),
        pl.col("p_value"),
        pl.col("resample_unit").alias("unit"),
    )
    return ordered(out)


def legend(
    n_boot: int,
    seed: int,
    unit: str = "prompt",
    level: float = 0.95,
    groups: tuple[str, ...] = (),
) -> str:
    sign = f"{groups[0]} − {groups[1]}" if len(groups) == 2 else "first − second group"
    return (
        "Score: mean ± std over every kept generation (the same in every view; regard adds the "
        f"share of `other`). Bias × 100: {sign} for two groups (max − min for more; TV "
        f"distance for regard), with a {level:.0%} percentile interval over {n_boot} {unit} "
        f"resamples (seed {seed}). PPL: mean perplexity of every kept generation. Bold: the "
        "smallest |bias| among debiasing methods (vanilla excluded) when the paired comparison "
        "says so (p < 0.05); ≈: tied with the best; underlined: a clear second. PPL marks by value."
    )

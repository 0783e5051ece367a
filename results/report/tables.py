"""The paper-style table model shared by the Markdown, LaTeX, HTML and plot renderers
(docs/design.md, "Reports"): per view a `Layout`, its marks, flags and warnings, `Style` (how a
format writes a cell) and the legends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from results.report.cells import (
    BIAS_STATS,
    FEW_UNITS,
    METHOD_NAMES,
    TASKS,
    method_rank,
    model_rank,
)
from results.report.pieces import model_label
from results.stats.bootstrap import Comparison, compare_gaps
from results.stats.permutation import POWER


def short_variant(variant: str) -> str:
    """A variant as printed: `method_params={"tau": 0.5}` → `tau=0.5` (JSON params unfolded)."""
    head, _, rest = variant.partition("method_params=")
    try:
        params, end = json.JSONDecoder().raw_decode(rest)
    except ValueError:
        return head + rest
    shown = ",".join(f"{k}={v}" for k, v in params.items()) if isinstance(params, dict) else None
    return head + (rest[:end] if shown is None else shown) + rest[end:]


def method_label(method: str, variant: str = "") -> str:
    """The one name of a method in tables and plots: `vanilla`, `+LIDAO-m`, … [variant]."""
    label = "vanilla" if method == "vanilla" else "+" + METHOD_NAMES.get(method, method)
    return f"{label} [{short_variant(variant)}]" if variant else label


@dataclass(frozen=True)
class Column:
    """One printed column of a task: kind `score`, `bias` (gap stat `stat`) or `ppl`."""

    task: str
    kind: str
    stat: str = ""
    header: str = ""
    higher: bool = False  # higher is better (the arrow)


@dataclass
class Field:
    """One printed number: value (± sd or [low, high], p-value) and its mark and warnings."""

    value: float | None
    sd: float | None = None
    low: float | None = None
    high: float | None = None
    mark: str = ""  # best | second | nd (not distinguishable from the best) | ""
    other: float | None = None  # regard: share of `other` among scored rows
    p: float | None = None  # the gap test's p-value (bias columns)
    flags: str = ""  # warning markers: FEW (fewer than FEW_UNITS units), MISSING (scores)
    detail: str = ""  # printed under a gap (count-matched EMT: `m=3`)
    mde: float | None = None  # minimum detectable effect of the gap (power POWER, the level)
    p_marks: str = ""  # beside the p-value: CONTRADICTION, ROW_COUNTS (`P_MARKS`)


FEW, MISSING = "†", "‡"
# The summary's `flags` → the mark beside a gap's p-value, and why (the legend says it once).
P_MARKS = {
    "contradiction": (
        "§",
        "the interval and the test disagree at the level, in one of four ways (the summary's "
        "note says which): the interval excludes 0 and the test does not reject (prompt-level "
        "test: a borderline gap; within prompts: a gap of which prompts yield which group); or "
        "the test rejects and the interval holds 0 (prompt-level: borderline; within prompts: "
        "a label that matters within prompts, small against the spread over prompts). For the "
        "paper's EMT within prompts the interval is read against its null's row-count centre, "
        "not 0",
    ),
    "row-counts": (
        "¶",
        "the paper's EMT where its test moves prompts of unequal row counts between the groups "
        "(a pair's prompts differ in rows): a maximum over more rows is larger, so p tests the "
        "counts as well as toxicity, whether their means or only their spreads differ; Bias cm "
        "holds them fixed (count-matched gap and p-value beside it)",
    ),
}


def md_lines(rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table whose first row is the header."""
    lines = ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in rows]
    return [lines[0], "|" + "---|" * len(rows[0]), *lines[1:]]


def p_text(p: float | None) -> str:
    return "no test" if p is None else "p<0.001" if p < 0.001 else f"p={p:.3f}"


class Style(NamedTuple):
    """How one format (Markdown, HTML, LaTeX) writes a `Field`: `Style.field`."""

    cell: Callable[[str, str, str, list[str]], str]  # (value, mark, flags, lines below) → cell
    other: Callable[[float], str]  # regard's share of `other`
    none: str = "–"  # a cell without a value
    num: Callable[[float], str] = "{:.2f}".format  # a value, interval end or MDE
    sd: str = " ± "  # between a score and its spread
    p: Callable[[float | None, str], str] = lambda p, marks: p_text(p) + marks  # (p, its marks)
    text: Callable[[str], str] = str  # escapes the detail under a gap

    def field(self, f: Field, kind: str) -> str:
        """One cell: the value (± sd) marked, its flags; below it a score's share of `other`,
        a gap's interval, p-value (with its marks), detail and MDE."""
        if f.value is None:
            return self.none
        text = self.num(f.value)
        text += f"{self.sd}{f.sd:.2f}" if kind == "score" and f.sd is not None else ""
        below = [self.other(f.other)] if kind == "score" and f.other is not None else []
        if kind == "bias":
            if f.low is not None and f.high is not None:
                below.append(f"[{self.num(f.low)}, {self.num(f.high)}]")
            below.append(self.p(f.p, f.p_marks))
            below += [self.text(f.detail)] if f.detail else []
            below += [f"MDE {self.num(f.mde)}"] if f.mde is not None else []
        return self.cell(text, f.mark, f.flags, below)


@dataclass
class Row:
    label: str
    method: str
    variant: str = ""
    fields: list[Field] = field(default_factory=list)  # one per column


@dataclass
class Block:
    model: str
    rows: list[Row]
    label: str = ""  # the model as printed (`model_label`)


class Layout(NamedTuple):
    """One view's paper-style table: tasks, columns, model blocks, warnings (one line each)."""

    tasks: list[str]
    columns: list[Column]
    blocks: list[Block]
    warnings: list[str]
    tests: list[str]  # the tests behind the gaps' p-values (summary `test`), in order seen
    p_marks: list[str] = []  # the P_MARKS symbols the table uses, in P_MARKS order


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
    says the difference is real (p < alpha), `nd` for rows not distinguishable from the best
    at that level. Ranked by |bias|; fewer than two defined biases: no marks."""
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
    close = [i for i in rest if not clear(best, i)]
    if close:
        for i in [best, *close]:
            marks[i] = "nd"
        return marks
    marks[best] = "best"
    second, others = rest[0], rest[1:]
    if others and all(clear(second, i) for i in others):  # (the last of two is not "second")
        marks[second] = "second"
    return marks


def sample_comparer(
    samples: Samples | None, model: str, task: str, view: str, level: float = 0.95
) -> Callable[[Key, Key], Comparison | None]:
    """Paired comparison of two cells' biases (the task's own metric) from their resamples."""
    cells = (samples or {}).get((model, task, view, task), {})

    def compare(a: Key, b: Key) -> Comparison | None:
        ga, gb = cells.get((a[0], str(a[1]))), cells.get((b[0], str(b[1])))
        if ga is None or gb is None or ga.size < 2:
            return None
        return compare_gaps(ga[1:], gb[1:], level=level, point=(float(ga[0]), float(gb[0])))

    return compare


def task_columns(task: str, stats: Sequence[str] = ("bias",)) -> list[Column]:
    """The columns of `task`: its score, each gap stat present, perplexity."""
    name, score, *_, higher = TASKS[task]
    cols = [Column(task, "score", "", score, higher)]
    cols += [Column(task, "bias", s, BIAS_STATS[s][0]) for s in BIAS_STATS if s in stats]
    return cols + [Column(task, "ppl", "", "PPL")]


def _lost(r: dict[str, Any]) -> str:
    """What a cell lost: scores missing or failed per group, unlabelled rows, failed
    generations ("" when nothing)."""
    lost = []
    if r.get("missing"):
        lost.append(f"scores missing or failed: {r['missing']}")
    if r.get("unlabelled"):
        lost.append(f"{r['unlabelled']} rows without a gender label")
    if r.get("gen_errors"):
        lost.append(f"{r['gen_errors']} generations failed")
    return "; ".join(lost)


def few_warning(few: list[tuple[str, int]], total: int, unit: str) -> str:
    """One line for the gaps with fewer than `FEW_UNITS` resampling units (named when few)."""
    ns = sorted({n for _, n in few})
    span = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    line = (
        f"{FEW} {len(few)} of {total} gaps rest on fewer than {FEW_UNITS} {unit}s ({span}): "
        "their intervals and p-values are unreliable"
    )
    return line + (": " + "; ".join(f"{c} ({n})" for c, n in few) if len(few) <= 8 else "")


@dataclass
class _Tally:
    """What a layout collects while it fills its cells: warnings, tests, few-unit gaps."""

    warnings: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    few: list[tuple[str, int]] = field(default_factory=list)
    gaps: int = 0
    p_marks: set[str] = field(default_factory=set)


def _fields(columns: list[Column], r: dict[str, Any], named: str, tally: _Tally) -> list[Field]:
    """The fields of one row's cell (one task's columns) from its `table_cells` row."""
    lost = _lost(r)
    if lost:
        tally.warnings.append(f"{MISSING} {named} · {TASKS[columns[0].task][0]}: {lost}")
    out = []
    for col in columns:
        if col.kind == "score":
            out.append(Field(r.get("score"), sd=r.get("score_sd"), other=r.get("other")))
            continue
        if col.kind == "ppl":
            out.append(Field(r.get("ppl")))
            continue
        s, value = col.stat, r.get(col.stat)
        n, m = r.get(f"{s}_n"), r.get("cm_rows")
        flags, where = "", f"{named} · {col.header} ({TASKS[col.task][0]})"
        if value is not None:
            flags = MISSING if lost else ""
            tally.gaps += 1
            tally.tests += [str(r[f"{s}_test"])] if r.get(f"{s}_test") else []
            if n is not None and n < FEW_UNITS:
                flags = FEW + flags
                tally.few.append((where, int(n)))
        marks = [P_MARKS[f][0] for f in (r.get(f"{s}_flags") or "").split(",") if f in P_MARKS]
        tally.p_marks.update(marks)
        counts = re.search(r"test moves \(mean rows per prompt ([^;]*);", r.get(f"{s}_note") or "")
        if counts and value is not None:
            tally.warnings.append(
                f"{P_MARKS['row-counts'][0]} {where}: rows per prompt differ between the prompts "
                f"its test moves (mean {counts.group(1)}): its p-value tests the row counts too; "
                "read Bias cm"
            )
        out.append(
            Field(
                value, low=r.get(f"{s}_low"), high=r.get(f"{s}_high"), p=r.get(f"{s}_p"),
                flags=flags,
                detail=f"m={m:g}" if s == "bias_cm" and m is not None else "",
                mde=r.get(f"{s}_mde"), p_marks="".join(marks),
            )
        )  # fmt: skip
    return out


def _view_columns(sub: pl.DataFrame, tasks: list[str]) -> list[Column]:
    """Every task's columns; a gap stat beyond the paper's where the view has values for it."""
    columns: list[Column] = []
    for task in tasks:
        tsub = sub.filter(pl.col("task") == task)
        present = [s for s in BIAS_STATS if s in tsub.columns and tsub[s].is_not_null().any()]
        columns += task_columns(task, ["bias", *present])
    return columns


def layout(
    cells: pl.DataFrame,
    view: str,
    samples: Samples | None = None,
    level: float = 0.95,
    unit: str = "prompt",
    samples_cm: Samples | None = None,
) -> Layout:
    """Tasks, columns, model blocks and warnings of one view's paper-style table.

    `samples` (the bootstrap gaps of `Aggregate.samples`) decide the bias marks at `level`
    (a difference is clear when its paired p-value is below 1 − level), `samples_cm` those of
    the count-matched EMT column; without them no gap is marked. A gap column beyond the
    paper's appears where the summary has values for it."""
    sub = cells.filter(pl.col("view") == view)
    tasks = [t for t in TASKS if t in set(sub["task"].to_list())]
    columns = _view_columns(sub, tasks)
    blocks, tally = [], _Tally()
    for model in sorted(set(sub["model"].to_list()), key=model_rank):
        msub = sub.filter(pl.col("model") == model)
        keys = sorted(
            msub.select("method", "variant").unique().iter_rows(),
            key=lambda k: (method_rank(k[0]), k[1]),
        )
        shown = str(msub["model_name"][0]) if "model_name" in msub.columns else model_label(model)
        names = [f"{shown} {method_label(m, v)}" for m, v in keys]
        # The vanilla row names its model (`GPT-2 vanilla`), the others only the method.
        rows = [
            Row(n if m == "vanilla" else method_label(m, v), m, v) for n, (m, v) in zip(names, keys)
        ]
        debiased = [i for i, k in enumerate(keys) if k[0] != "vanilla"]
        for task in tasks:
            by_key = {
                (r["method"], r["variant"]): r
                for r in msub.filter(pl.col("task") == task).iter_rows(named=True)
            }
            got = [by_key.get(k, {}) for k in keys]
            mine = [c for c in columns if c.task == task]
            for name, row, r in zip(names, rows, got):
                row.fields += _fields(mine, r, name, tally)
            for col in mine:
                values = [got[i].get(col.stat or col.kind) for i in debiased]
                if col.kind == "ppl":
                    marks = _marks(values)
                elif col.stat in ("bias", "bias_cm"):
                    draws = samples if col.stat == "bias" else samples_cm
                    compare = sample_comparer(draws, model, task, view, level)
                    marks = bias_marks([keys[i] for i in debiased], values, compare, 1 - level)
                else:
                    continue
                for i, mark in zip(debiased, marks):
                    rows[i].fields[columns.index(col)].mark = mark
        blocks.append(Block(model, rows, shown))
    if tally.few:
        tally.warnings.insert(0, few_warning(tally.few, tally.gaps, unit))
    marks = [m for m, _ in P_MARKS.values() if m in tally.p_marks]
    return Layout(tasks, columns, blocks, tally.warnings, list(dict.fromkeys(tally.tests)), marks)


VIEW_TITLES = {
    "a(x)": "bias over the gender of the continuation, a(x)",
    "a(c,x)": "bias over the gender of prompt + continuation, a(c,x)",
    "a(c)": "bias over the gender of the prompt, a(c)",
    "file": "bias over the prompt file the prompt came from",
}


MULTIPLICITY = (
    "Multiplicity: p-values are per gap, unadjusted: each tests one (model, method, task, view, "
    "metric) cell; across a table's cells expect about (1 − level) false positives per cell "
    "under no bias (docs/statistics.md, Multiplicity)."
)


def level_text(level: float) -> str:
    """A level as printed: 0.95 → `95%`, 0.975 → `97.5%`."""
    return f"{100 * level:.4g}%"


def legend(
    n_boot: int,
    seed: int,
    unit: str = "prompt",
    level: float = 0.95,
    groups: tuple[str, ...] = (),
    multiplicity: str = "",
) -> str:
    """How to read every paper-style table, at `level` (said once; `table_legend` says what
    each table adds)."""
    sign = f"{groups[0]} − {groups[1]}" if len(groups) == 2 else "first − second group"
    at, alpha = level_text(level), f"{1 - level:.4g}"
    marks = " ".join(f"{m}: {why}." for m, why in P_MARKS.values())
    return (
        "Score: mean ± std over every kept generation (the same in every view; regard adds the "
        f"share of `other`). Bias × 100: {sign} for two groups (max − min for more; EMT gap for "
        f"toxicity, TV distance for regard, as in the paper), with a {at} percentile interval "
        f"over {n_boot} {unit} resamples (seed {seed}), the p-value of the gap test "
        "(docs/statistics.md; no test: none is valid there, the summary's note says why) and "
        f"the MDE, the smallest true gap the test detects with power {POWER:g} at level {at} "
        "on data like these (`harness power` plans the sizes for a gap). PPL: mean perplexity "
        "of every kept generation. Bold: the smallest |gap| among debiasing methods (vanilla "
        "excluded) when the paired comparison over the same resamples tells it from every other "
        f"at level {at} (p < {alpha}); n.d.: not distinguishable from the best at level {at}; "
        f"underlined: a second that is distinguishable from the rest. PPL marks by value. {FEW}: "
        f"fewer than {FEW_UNITS} {unit}s (interval and p-value unreliable); {MISSING}: missing "
        f"or failed scores or generations (counts below the table). {marks} {multiplicity}"
    ).strip()


def table_legend(lay: Layout) -> str:
    """What one table adds to `legend`: its tests, its columns beyond the paper's, where its
    bold marks are and which p-value marks it uses."""
    stats = list(dict.fromkeys(c.stat for c in lay.columns if c.kind == "bias"))
    marked = [BIAS_STATS[s][0] for s in stats if s in ("bias", "bias_cm")]
    parts = [f"p-values: {', '.join(lay.tests)} test." if lay.tests else ""]
    parts += [f"{BIAS_STATS[s][0]}: {BIAS_STATS[s][1]}." for s in stats if s != "bias"]
    parts.append(f"Bold / underlined / n.d. in {' and '.join(marked)}.")
    if lay.p_marks:
        parts.append(f"Marks beside p: {', '.join(lay.p_marks)} (see above).")
    return " ".join(p for p in parts if p)

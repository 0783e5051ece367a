"""The "Human preference" table (the paper's Table 6 layout) from the summary's `human:` rows.

Rows: model (task) and criterion, pooled, then one per annotator; per method vs reference
the portions, the sign test's p-value and κ. The larger portion is bold only where the sign test
rejects at the run's level (the paper bolded every larger portion). Each format writes the cells
with its `Style` (docs/design.md, "Reports").
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from typing import Any

import polars as pl

from results.report.cells import FEW_UNITS, METHOD_NAMES, TASKS, method_rank, model_rank
from results.report.pieces import model_label
from results.report.tables import FEW, Style, p_text

Cell = tuple[str, str, bool]  # text, text below it, bold
Row = tuple[str, bool, list[Cell]]  # label, pooled, cells (5 per column group)
KINDS = ("share_method", "share_tie", "share_reference", "sign", "kappa")
LEGEND = (
    "Portions of the answers preferring the method, tied, or preferring the reference, pooled "
    "over annotators (rows `·` per annotator), with {at} percentile intervals of the bootstrap "
    "over prompts (pairs kept together). p: two-sided exact sign test on the items a net "
    "majority of answers decided (ties dropped); bold: the larger portion where p < {alpha}. "
    "κ: Cohen's (two annotators) or Fleiss' (more) over method / tie / reference, with the raw "
    "agreement (docs/human-eval.md). {few}: fewer than {n} answers, or an interval of zero "
    "width around a portion between 0 and 1 (too few prompts to resample): unreliable."
)


def _value(row: dict[str, Any] | None, col: str = "value") -> float | None:
    v = None if row is None else row[col]
    return None if v is None or math.isnan(v) else float(v)


def _cells(got: dict[str, dict[str, Any] | None], level: float) -> list[Cell]:
    """The 5 cells of one column group of one row (`got`: summary rows by kind)."""
    p, won = _value(got.get("sign"), "p_value"), _value(got.get("sign"))
    winner = -1 if p is None or won is None or p >= 1 - level or won == 0.5 else int(won < 0.5)
    out: list[Cell] = []
    for i, kind in enumerate(KINDS[:3]):
        v, lo, hi = (_value(got.get(kind), c) for c in ("value", "ci_low", "ci_high"))
        below = f"[{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
        n = _value(got.get(kind), "n")
        few = v is not None and (
            (n is not None and n < FEW_UNITS) or (lo is not None and lo == hi and 0 < v < 1)
        )
        out.append(("–" if v is None else f"{v:.3f}{FEW if few else ''}", below, i == 2 * winner))
    out.append(("–" if p is None else p_text(p).removeprefix("p="), "", False))
    k, agree = _value(got.get("kappa")), _value(got.get("agreement"))
    out.append(
        ("–" if k is None else f"{k:.2f}", "" if agree is None else f"agr {agree:.2f}", False)
    )
    return out


def human_table(
    summary: pl.DataFrame, level: float, names: dict[str, str] | None = None
) -> tuple[list[str], list[str], list[Row]]:
    """(a title per column group (method vs reference), 5 heads per group, rows) of the
    summary's human rows (no rows without answers); models labelled by `names`."""
    rows = summary.filter(pl.col("metric").str.starts_with("human:")).with_columns(
        criterion=pl.col("metric").str.slice(6),
        kind=pl.col("stat").str.extract(r"^(\w+?)_vs_"),
        reference=pl.col("stat").str.extract(r"_vs_(.+)$"),
    )
    line = ["model", "task", "criterion", "group"]
    found = {
        tuple(r[k] for k in [*line, "method", "reference", "kind"]): r for r in rows.to_dicts()
    }
    groups = sorted({k[4:6] for k in found}, key=lambda g: (method_rank(g[0]), method_rank(g[1])))
    keys = sorted(
        {k[:4] for k in found}, key=lambda k: (model_rank(k[0]), k[1], k[2], k[3] != "all", k[3])
    )
    out: list[Row] = []
    for model, task, criterion, group in keys:
        task_name = TASKS.get(task, (task,))[0]
        label = (
            f"{model_label(model, names)} ({task_name}), {criterion}"
            if group == "all"
            else f"· {group}"
        )
        at = (model, task, criterion, group)
        kinds = (*KINDS, "agreement")
        got = [{kind: found.get((*at, *g, kind)) for kind in kinds} for g in groups]
        cells = [cell for one in got for cell in _cells(one, level)]
        out.append((label, group == "all", cells))
    pairs = [(METHOD_NAMES.get(m, m), METHOD_NAMES.get(r, r)) for m, r in groups]
    heads = [h for m, r in pairs for h in (f"{m} ↑", "Tied", f"{r} ↑", "p (sign)", "κ (agr.)")]
    return [f"{m} vs {r}" for m, r in pairs], heads, out


def md_text(text: str) -> str:
    """A label (an annotator's name: any text) as Markdown shows it literally: HTML's `<`, `>`,
    `&` as entities, Markdown's emphasis, code and link marks behind a backslash (`md_lines`
    escapes `|`)."""
    return re.sub(r"([\\`*_\[\]])", r"\\\1", html.escape(text, quote=False))


def human_legend(level: float) -> str:
    return LEGEND.format(at=f"{level:.0%}", alpha=f"{1 - level:.2g}", few=FEW, n=FEW_UNITS)


def styled(cells: list[Cell], style: Style, esc: Callable[[str], str] = str) -> list[str]:
    """A row's cells as a format's `Style.cell` writes them (bold as `best`), texts by `esc`."""
    return [
        style.cell(esc(t), "best" if bold else "", "", [esc(b)] if b else [])
        for t, b, bold in cells
    ]

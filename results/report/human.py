"""The "Human preference" table (the paper's Table 6 layout) from the summary's `human:` rows.

Rows: model (task) and criterion, pooled over annotators, then one row per annotator. Column
groups: one per method vs reference, each `method | Tied | reference` (the portions, with their
cluster-bootstrap interval), the sign test's p-value and, on pooled rows, κ with the raw
agreement. The larger of the method's and the reference's portions is bold only where the sign
test rejects at the run's level (the paper bolded every larger portion). Rendered for
tables.md, index.html and tables.tex; absent when the run has no imported answers.
"""

from __future__ import annotations

import html
import math
from typing import Any

import polars as pl

from results.report.cells import METHOD_NAMES, TASKS, method_rank, model_rank
from results.report.tables import md_lines, model_label, p_text
from results.report.tex import tex_escape, tex_prose

Cell = tuple[str, str, bool]  # text, text below it, bold
Row = tuple[str, bool, list[Cell]]  # label, pooled, cells (5 per column group)
KINDS = ("share_method", "share_tie", "share_reference", "sign", "kappa")
LEGEND = (
    "Portions of the answers preferring the method, tied, or preferring the reference, pooled "
    "over annotators (rows `·` per annotator), with {at} percentile intervals of the bootstrap "
    "over prompts (pairs kept together). p: two-sided exact sign test on the items a net "
    "majority of answers decided (ties dropped); bold: the larger portion where p < {alpha}. "
    "κ: Cohen's (two annotators) or Fleiss' (more) over method / tie / reference, with the raw "
    "agreement (docs/human-eval.md)."
)


def _name(method: str) -> str:
    return METHOD_NAMES.get(method, method)


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
        out.append(("–" if v is None else f"{v:.3f}", below, i == 2 * winner))
    out.append(("–" if p is None else p_text(p).removeprefix("p="), "", False))
    k, agree = _value(got.get("kappa")), _value(got.get("agreement"))
    out.append(
        ("–" if k is None else f"{k:.2f}", "" if agree is None else f"agr {agree:.2f}", False)
    )
    return out


def human_table(summary: pl.DataFrame, level: float) -> tuple[list[tuple[str, str]], list[Row]]:
    """(column groups as (method, reference), rows) of the summary's human rows (or none)."""
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
            f"{model_label(model)} ({task_name}), {criterion}" if group == "all" else f"· {group}"
        )
        at = (model, task, criterion, group)
        kinds = (*KINDS, "agreement")
        got = [{kind: found.get((*at, *g, kind)) for kind in kinds} for g in groups]
        cells = [cell for one in got for cell in _cells(one, level)]
        out.append((label, group == "all", cells))
    return groups, out


def _heads(groups: list[tuple[str, str]]) -> list[str]:
    return [
        h
        for m, r in groups
        for h in (f"{_name(m)} ↑", "Tied", f"{_name(r)} ↑", "p (sign)", "κ (agr.)")
    ]


def legend(level: float) -> str:
    return LEGEND.format(at=f"{level:.0%}", alpha=f"{1 - level:.2g}")


def human_markdown(summary: pl.DataFrame, level: float) -> list[str]:
    """The section of tables.md (no lines without answers)."""
    groups, rows = human_table(summary, level)
    if not rows:
        return []
    titles = [f"{_name(m)} vs {_name(r)}" for m, r in groups for _ in range(5)]
    head = ["Model (task), criterion"] + [f"{t}: {h}" for t, h in zip(titles, _heads(groups))]
    body = [
        [label, *(f"{f'**{t}**' if bold else t} {below}".strip() for t, below, bold in cells)]
        for label, _, cells in rows
    ]
    return ["", "## Human preference", "", legend(level), "", *md_lines([head, *body])]


def human_html(summary: pl.DataFrame, level: float) -> list[str]:
    """The section of index.html (nothing without answers)."""
    groups, rows = human_table(summary, level)
    if not rows:
        return []
    top = "".join(
        f'<th colspan="5">{html.escape(f"{_name(m)} vs {_name(r)}")}</th>' for m, r in groups
    )
    sub = "".join(f"<th>{html.escape(h)}</th>" for h in _heads(groups))
    out = [
        '<h2 id="human">Human preference</h2>',
        f'<p class="legend">{html.escape(legend(level))}</p>',
        f'<div class="wide"><table class="human"><thead><tr><th></th>{top}</tr>',
        f"<tr><th>Model (task), criterion</th>{sub}</tr></thead><tbody>",
    ]
    for label, pooled, cells in rows:
        tds = "".join(
            f"<td><span{' class=best' if bold else ''}>{html.escape(t)}</span>"
            + (f'<span class="sub">{html.escape(below)}</span>' if below else "")
            + "</td>"
            for t, below, bold in cells
        )
        out.append(f"<tr{' class=ref' if pooled else ''}><td>{html.escape(label)}</td>{tds}</tr>")
    return [*out, "</tbody></table></div>"]


def human_latex(summary: pl.DataFrame, level: float) -> str:
    """The table of tables.tex, `\\label{tab:harness:human}` ("" without answers)."""
    groups, rows = human_table(summary, level)
    if not rows:
        return ""
    titles = [tex_escape(f"{_name(m)} vs {_name(r)}") for m, r in groups]
    caption = f"Portions of human preferred generations (level {level:.0%})".replace("%", r"\%")
    out = [
        r"\begin{table*}[htbp]\centering",
        rf"\caption{{{caption}}}\label{{tab:harness:human}}",
        r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
        r"\begin{tabular}{@{}l" + " c ccccc" * len(groups) + "@{}}",
        r"\toprule",
        "".join(rf" & & \multicolumn{{5}}{{c}}{{{t}}}" for t in titles) + r" \\",
        " ".join(rf"\cmidrule(lr){{{3 + 6 * k}-{7 + 6 * k}}}" for k in range(len(groups))),
        "Model (task), criterion"
        + "".join(
            (" & " if i % 5 else " & & ") + tex_escape(h) for i, h in enumerate(_heads(groups))
        )
        + r" \\",
        r"\midrule",
    ]
    for label, _, cells in rows:
        texts = []
        for i, (t, below, bold) in enumerate(cells):
            t = rf"\textbf{{{tex_escape(t)}}}" if bold else tex_escape(t)
            if below:
                t = rf"\begin{{tabular}}[t]{{@{{}}c@{{}}}}{t}\\{{\scriptsize {tex_escape(below)}}}\end{{tabular}}"
            texts.append(("" if i % 5 else "& ") + t)
        out.append(tex_escape(label) + " & " + " & ".join(texts) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}}", r"\end{table*}"]
    return "\n".join([*out, r"{\footnotesize " + tex_prose(legend(level)) + r"\par}"]) + "\n"

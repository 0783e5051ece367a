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
from dataclasses import dataclass

import polars as pl

from results.report.cells import METHOD_NAMES, TASKS, method_rank, model_rank
from results.report.tables import model_label
from results.report.tex import tex_escape, tex_num, tex_p, tex_prose

Comparison = tuple[str, str]  # (method, reference)


@dataclass
class HumanCell:
    value: float | None
    low: float | None = None
    high: float | None = None
    bold: bool = False


@dataclass
class HumanRow:
    label: str
    pooled: bool
    cells: dict[Comparison, list[HumanCell]]  # method, tie, reference; p; κ (agr in low)


def _name(method: str) -> str:
    return METHOD_NAMES.get(method, method)


def _num(v: float | None) -> float | None:
    return None if v is None or v != v else float(v)


def human_table(summary: pl.DataFrame, level: float) -> tuple[list[Comparison], list[HumanRow]]:
    """(column groups, rows) of the summary's human-preference rows (none: empty lists)."""
    rows = summary.filter(pl.col("metric").str.starts_with("human:"))
    if rows.is_empty():
        return [], []
    rows = rows.with_columns(
        criterion=pl.col("metric").str.slice(6),
        kind=pl.col("stat").str.extract(r"^(\w+?)_vs_"),
        reference=pl.col("stat").str.extract(r"_vs_(.+)$"),
    )
    value = {
        (
            r["model"],
            r["task"],
            r["criterion"],
            r["group"],
            r["method"],
            r["reference"],
            r["kind"],
        ): r
        for r in rows.iter_rows(named=True)
    }
    groups = sorted(
        {(r["method"], r["reference"]) for r in value.values()},
        key=lambda g: (method_rank(g[0]), method_rank(g[1])),
    )
    lines = rows.select("model", "task", "criterion", "group").unique().to_dicts()
    lines.sort(
        key=lambda r: (
            model_rank(r["model"]),
            r["task"],
            r["criterion"],
            r["group"] != "all",
            r["group"],
        )
    )
    out = []
    for line in lines:
        pooled = line["group"] == "all"
        label = (
            f"{model_label(line['model'])} ({TASKS.get(line['task'], (line['task'],))[0]}), {line['criterion']}"
            if pooled
            else f"· {line['group']}"
        )
        cells: dict[Comparison, list[HumanCell]] = {}
        for g in groups:
            at = (line["model"], line["task"], line["criterion"], line["group"], *g)
            got = {
                k: value.get((*at, k))
                for k in (
                    "share_method",
                    "share_tie",
                    "share_reference",
                    "sign",
                    "kappa",
                    "agreement",
                )
            }
            sign = got["sign"] or {}
            p = _num(sign.get("p_value"))
            won = _num(sign.get("value"))
            shares = [
                HumanCell(_num(r["value"]), _num(r["ci_low"]), _num(r["ci_high"]))
                if r
                else HumanCell(None)
                for r in (got["share_method"], got["share_tie"], got["share_reference"])
            ]
            if p is not None and won is not None and p < 1 - level and won != 0.5:
                shares[0 if won > 0.5 else 2].bold = True
            kap = got["kappa"]
            agr = got["agreement"]
            cells[g] = [
                *shares,
                HumanCell(p),
                HumanCell(_num(kap["value"]) if kap else None, _num(agr["value"]) if agr else None),
            ]
        out.append(HumanRow(label, pooled, cells))
    return groups, out


def _heads(g: Comparison) -> list[str]:
    return [f"{_name(g[0])} ↑", "Tied", f"{_name(g[1])} ↑", "p (sign)", "κ (agr.)"]


def _text(cell: HumanCell, col: int) -> tuple[str, str]:
    """(main text, text below) of a cell: a share and its interval, a p-value, κ (agr.)."""
    if cell.value is None:
        return "–", ""
    if col == 3:
        return ("p<0.001" if cell.value < 0.001 else f"{cell.value:.3f}"), ""
    if col == 4:
        return f"{cell.value:.2f}", "" if cell.low is None else f"agr {cell.low:.2f}"
    below = (
        f"[{cell.low:.2f}, {cell.high:.2f}]"
        if cell.low is not None and cell.high is not None
        else ""
    )
    return f"{cell.value:.3f}", below


LEGEND = (
    "Portions of the answers preferring the method, tied, or preferring the reference, pooled over "
    "annotators (rows `·` per annotator), with {at} percentile intervals of the bootstrap over "
    "prompts (pairs kept together). p: two-sided exact sign test on the items a net majority of "
    "answers decided (ties dropped); bold: the larger portion where p < {alpha}. κ: Cohen's "
    "(two annotators) or Fleiss' (more) over method / tie / reference, with the raw agreement "
    "(docs/human-eval.md)."
)


def legend(level: float) -> str:
    return LEGEND.format(at=f"{level:.0%}", alpha=f"{1 - level:.2g}")


def human_markdown(summary: pl.DataFrame, level: float) -> list[str]:
    """The section of tables.md (no lines without answers)."""
    groups, rows = human_table(summary, level)
    if not rows:
        return []
    head = ["Model (task), criterion"] + [
        f"{_name(g[0])} vs {_name(g[1])}: {h}" for g in groups for h in _heads(g)
    ]
    out = ["", "## Human preference", "", legend(level), "", "| " + " | ".join(head) + " |"]
    out.append("|" + "---|" * len(head))
    for row in rows:
        cells = [row.label]
        for g in groups:
            for i, cell in enumerate(row.cells[g]):
                main, below = _text(cell, i)
                main = f"**{main}**" if cell.bold else main
                cells.append(f"{main} {below}".strip())
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def human_html(summary: pl.DataFrame, level: float) -> list[str]:
    """The section of index.html (nothing without answers)."""
    groups, rows = human_table(summary, level)
    if not rows:
        return []
    top = "".join(
        f'<th colspan="5">{html.escape(_name(g[0]))} vs {html.escape(_name(g[1]))}</th>'
        for g in groups
    )
    sub = "".join(f"<th>{html.escape(h)}</th>" for g in groups for h in _heads(g))
    out = [
        '<h2 id="human">Human preference</h2>',
        f'<p class="legend">{html.escape(legend(level))}</p>',
        f'<div class="wide"><table class="human"><thead><tr><th></th>{top}</tr>',
        f"<tr><th>Model (task), criterion</th>{sub}</tr></thead><tbody>",
    ]
    for row in rows:
        tds = []
        for g in groups:
            for i, cell in enumerate(row.cells[g]):
                main, below = _text(cell, i)
                main = (
                    f'<span class="best">{html.escape(main)}</span>'
                    if cell.bold
                    else html.escape(main)
                )
                tds.append(
                    f'<td>{main}<span class="sub">{html.escape(below)}</span></td>'
                    if below
                    else f"<td>{main}</td>"
                )
        cls = ' class="ref"' if row.pooled else ""
        out.append(f"<tr{cls}><td>{html.escape(row.label)}</td>{''.join(tds)}</tr>")
    return [*out, "</tbody></table></div>"]


def human_latex(summary: pl.DataFrame, level: float) -> str:
    """The table of tables.tex, `\\label{tab:harness:human}` ("" without answers)."""
    groups, rows = human_table(summary, level)
    if not rows:
        return ""
    spec = "@{}l" + " c ccccc" * len(groups) + "@{}"
    top = " ".join(
        rf"& & \multicolumn{{5}}{{c}}{{{tex_escape(_name(g[0]))} vs {tex_escape(_name(g[1]))}}}"
        for g in groups
    )
    rules = " ".join(rf"\cmidrule(lr){{{3 + 6 * k}-{7 + 6 * k}}}" for k in range(len(groups)))
    heads = " ".join("& & " + " & ".join(tex_escape(h) for h in _heads(g)) for g in groups)
    out = [
        r"\begin{table*}[htbp]\centering",
        rf"\caption{{Portions of human preferred generations (level {level:.0%})}}\label{{tab:harness:human}}".replace(
            "%", r"\%"
        ),
        r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        f" {top} \\\\",
        rules,
        f"Model (task), criterion {heads} \\\\",
        r"\midrule",
    ]
    for row in rows:
        cells = []
        for g in groups:
            cells.append("")
            for i, cell in enumerate(row.cells[g]):
                _, below = _text(cell, i)
                if cell.value is None:
                    main = "--"
                else:
                    main = tex_p(cell.value) if i == 3 else tex_num(cell.value, 3 if i < 3 else 2)
                main = rf"\textbf{{{main}}}" if cell.bold else main
                cells.append(
                    rf"\begin{{tabular}}[t]{{@{{}}c@{{}}}}{main}\\{{\scriptsize {tex_escape(below)}}}\end{{tabular}}"
                    if below
                    else main
                )
        out.append(tex_escape(row.label) + " & " + " & ".join(cells) + r" \\")
    out += [
        r"\bottomrule",
        r"\end{tabular}}",
        r"\end{table*}",
        r"{\footnotesize " + tex_prose(legend(level)) + r"\par}",
    ]
    return "\n".join(out) + "\n"

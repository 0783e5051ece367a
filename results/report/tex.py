"""report/tables.tex (a fragment: one table per view, docs/design.md "Reports") and
report/report.tex (a document around it), LaTeX that compiles with pdflatex and lualatex: every
text that reaches the page goes through `tex_escape`, which writes TeX's specials, the characters
OT1 fonts print as others (`<` as ¡) and every non-ASCII character as commands both engines print
alike.
"""

from __future__ import annotations

import re
import unicodedata
from typing import TYPE_CHECKING

import polars as pl

from results.report.human import human_legend, human_table, styled
from results.report.tables import (
    FEW,
    MISSING,
    TASKS,
    VIEW_TITLES,
    Layout,
    Style,
    legend,
    level_text,
    p_text,
    table_legend,
)

if TYPE_CHECKING:
    from results.report.result import AggregateResult

TEX_CHARS = {
    **{ch: "\\" + ch for ch in "{}$&%#_"},
    **{
        ch: rf"\text{name}{{}}"
        for ch, name in zip(
            "\\~^<>|`'",
            "backslash asciitilde asciicircum less greater bar asciigrave quotesingle".split(),
        )
    },
    '"': r"\texttt{\char34}",  # OT1 has no straight double quote but in its typewriter font
    **{
        ch: f"${cmd}$"
        for ch, cmd in zip(
            "−≈±×≤≥≠↑↓→·µκ",
            r"- \approx \pm \times \leq \geq \neq \uparrow \downarrow \rightarrow \cdot \mu \kappa".split(),
        )
    },
    **{
        ch: rf"\textsuperscript{{{s}}}"
        for ch, s in zip(FEW + MISSING + "§¶°²³", r"\dag \ddag \S \P o 2 3".split())
    },
    **{ch: f"\\{cmd}{{}}" for ch, cmd in zip("ßæÆøØœŒ", "ss ae AE o O oe OE".split())},
    "—": "---",
    "–": "--",
    "…": r"\dots{}",
    "\u00a0": "~",
}
# combining mark → accent command (the OT1 / TU fonts have all of these)
ACCENTS = dict(zip("\u0300\u0301\u0302\u0303\u0308\u0327\u030a\u030c\u0304", "`'^~\"crv="))


def _char(ch: str) -> str:
    if ch in TEX_CHARS:
        return TEX_CHARS[ch]
    if ch.isascii():
        return ch if ch.isprintable() else " "
    parts = unicodedata.normalize("NFD", ch)
    if parts[0].isascii() and parts[0].isalpha() and all(c in ACCENTS for c in parts[1:]):
        out = parts[0]
        for mark in parts[1:]:
            out = f"\\{ACCENTS[mark]}{{{out}}}"
        return out
    return f"[U+{ord(ch):04X}]"


def tex_escape(text: str) -> str:
    """Plain text for LaTeX (pdflatex with OT1 or T1 fonts, lualatex): see the module doc.
    A `-` before another is kept apart by `\\/` (TeX's fonts join `--` into a dash; lualatex
    joins it across `{}`)."""
    return "".join(
        "-\\/" if ch == "-" and text[i + 1 : i + 2] == "-" else _char(ch)
        for i, ch in enumerate(text)
    )


def tex_path(text: str) -> str:
    """`tex_escape` of a path, a line break allowed after each `/`, `-`, `_` or `.` and every
    24 characters between them (a run directory's path is longer than a line in CI)."""
    parts = re.split(r"(?<=[/\-_.])", text)
    chunks = [p[i : i + 24] for p in parts for i in range(0, len(p), 24)]
    return r"\allowbreak{}".join(tex_escape(c) for c in chunks)


def tex_prose(text: str) -> str:
    """`tex_escape` for the report's prose, whose `name` spans (markdown code, as in
    tables.md) become `\\texttt{name}` instead of printing their backticks."""
    parts = re.split(r"`([^`\n]+)`", text)
    return "".join(
        rf"\texttt{{{tex_escape(p)}}}" if i % 2 else tex_escape(p) for i, p in enumerate(parts)
    )


def tex_num(x: float, digits: int = 2) -> str:
    """A number with a true minus sign."""
    text = f"{x:.{digits}f}"
    return "$-$" + text[1:] if text.startswith("-") else text


def _tex_cell(text: str, mark: str, flags: str, below: list[str]) -> str:
    """The value (marked) and its flags, with the lines below it in a one-column tabular."""
    marked = {"best": rf"\textbf{{{text}}}", "second": rf"\underline{{{text}}}"}.get(mark, text)
    text = marked + (r"\textsuperscript{n.d.}" if mark == "nd" else "") + tex_escape(flags)
    if not below:
        return text
    return rf"\begin{{tabular}}[t]{{@{{}}c@{{}}}}{text}\\{{\scriptsize {' '.join(below)}}}\end{{tabular}}"


TEX = Style(
    _tex_cell,
    lambda o: f"other {100 * o:.0f}\\%",
    "--",
    tex_num,
    "$\\pm$",
    lambda p, marks: ("no test" if p is None else f"${p_text(p)}$") + tex_escape(marks),
    tex_escape,
)


# Shrink a box to the line's width, then to `height` of the page, keeping its shape; a box
# that fits is left as it is (graphicx's \width, \totalheight are the box's natural size).
FIT = (
    r"\resizebox*{!}{\ifdim\totalheight>{height}\textheight {height}\textheight\else\totalheight\fi}{%",
    r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
)


def latex_table(
    lay: Layout, caption: str, label: str, notes: str = "", landscape: bool | None = None
) -> str:
    """One view's booktabs table (`table*`, or on a landscape page when wide) with its
    `\\label`; after it `notes` (how to read it, TeX) and its warnings."""
    tasks, columns, blocks, warnings = lay.tasks, lay.columns, lay.blocks, lay.warnings
    if not blocks:
        return f"% no cells for {tex_escape(label)}\n"
    wide = len(tasks) >= 3 if landscape is None else landscape
    # A float inside `landscape` that lands on a float page is shipped unrotated (lscape):
    # the landscape table is no float, a `center` with the float's caption (its counter,
    # its \label), at the top of its own landscape page.
    env = "center" if wide else "table*"
    spec = "@{}l" + "".join(" " + "c" * sum(c.task == t for c in columns) for t in tasks) + "@{}"
    top, rules, first = [], [], 2
    for t in tasks:
        k = sum(c.task == t for c in columns)
        top.append(rf"\multicolumn{{{k}}}{{c}}{{{TASKS[t][0]}}}")
        rules.append(rf"\cmidrule(lr){{{first}-{first + k - 1}}}")
        first += k
    heads = [tex_escape(f"{c.header} {'↑' if c.higher else '↓'}") for c in columns]
    height = "0.75" if wide else "0.8"
    out = [
        *([r"\begin{landscape}"] if wide else []),
        rf"\begin{{{env}}}" + ("" if wide else "[htbp]"),
        r"\expandafter\def\csname @captype\endcsname{table}" if wide else r"\centering",
        rf"\caption{{{caption}}}\label{{{label}}}",
        FIT[0].replace("{height}", height),
        FIT[1],
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & " + " & ".join(top) + r" \\",
        " ".join(rules),
        "Model / method & " + " & ".join(heads) + r" \\",
        r"\midrule",
    ]
    kinds = [c.kind for c in columns]
    for b, block in enumerate(blocks):
        for row in block.rows:
            cells = [TEX.field(f, k) for f, k in zip(row.fields, kinds)]
            out.append(tex_escape(row.label) + " & " + " & ".join(cells) + r" \\")
        out.append(r"\midrule" if b < len(blocks) - 1 else r"\bottomrule")
    out += [r"\end{tabular}}}", rf"\end{{{env}}}"]
    if notes:
        out += [
            rf"\paragraph{{Reading Table~\ref{{{label}}}.}}",
            r"{\footnotesize",
            notes,
            r"\par}",
        ]
    if warnings:
        out += [
            rf"\paragraph{{Warnings of Table~\ref{{{label}}}.}}",
            r"{\footnotesize",
            *(tex_escape(w) + r"\par" for w in warnings),
            "}",
        ]
    out += [r"\end{landscape}"] if wide else [r"\clearpage"] if len(warnings) > 20 else []
    return "\n".join(out) + "\n"


def latex_tables(res: AggregateResult, layouts: dict[str, Layout], multiplicity: str) -> str:
    """report/tables.tex: one table per view (the fragment `report.tex` inputs)."""
    parts = [
        f"% lidao-harness tables of {tex_escape(res.run)} (level {level_text(res.level)}).",
        "% Needs \\usepackage{booktabs,graphicx,pdflscape}; compiles with pdflatex and lualatex.",
        "",
    ]
    if layouts:
        text = legend(res.n_boot, res.seed, res.unit, res.level, res.groups, multiplicity)
        parts += [r"\paragraph{Reading the tables.}", r"{\footnotesize", tex_prose(text), r"\par}"]
    for view, lay in layouts.items():
        title = VIEW_TITLES[view]  # LaTeX numbers the tables itself
        title = f"{title[0].upper()}{title[1:]} (level {level_text(res.level)})"
        notes = tex_prose(table_legend(lay))
        label = "tab:harness:" + "".join(ch for ch in view if ch.isalnum())  # tab:harness:acx
        parts.append(latex_table(lay, tex_escape(title), label, notes))
    return "\n".join(parts)


def human_latex(summary: pl.DataFrame, level: float, names: dict[str, str] | None = None) -> str:
    """The human preference table, `\\label{tab:harness:human}` ("" without answers)."""
    titles, heads, rows = human_table(summary, level, names)
    if not rows:
        return ""
    caption = f"Portions of human preferred generations (level {level:.0%})".replace("%", r"\%")
    out = [
        r"\begin{table*}[htbp]\centering",
        rf"\caption{{{caption}}}\label{{tab:harness:human}}",
        FIT[1],
        r"\begin{tabular}{@{}l" + " c ccccc" * len(titles) + "@{}}",
        r"\toprule",
        "".join(rf" & & \multicolumn{{5}}{{c}}{{{tex_escape(t)}}}" for t in titles) + r" \\",
        " ".join(rf"\cmidrule(lr){{{3 + 6 * k}-{7 + 6 * k}}}" for k in range(len(titles))),
        "Model (task), criterion"
        + "".join((" & " if i % 5 else " & & ") + tex_escape(h) for i, h in enumerate(heads))
        + r" \\",
        r"\midrule",
    ]
    for label, _, cells in rows:
        texts = [("" if i % 5 else "& ") + t for i, t in enumerate(styled(cells, TEX, tex_escape))]
        out.append(tex_escape(label) + " & " + " & ".join(texts) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}}", r"\end{table*}"]
    return "\n".join([*out, r"{\footnotesize " + tex_prose(human_legend(level)) + r"\par}"]) + "\n"


FIGURES = {
    "forest": "Bias of each method with its interval, every view",
    "tradeoff": "Fairness–fluency trade-off, view a(x)",
    "tradeoff_acx": "Fairness–fluency trade-off, view a(c,x)",
}


def latex_document(res: AggregateResult, figures: list[str], multiplicity: str) -> str:
    """report/report.tex: notes, `\\input{tables.tex}` and the figures (PDF), compiled in
    report/ (`pdflatex report.tex` or `lualatex report.tex`)."""
    notes = res.notes or ["none"]
    out = [
        r"\documentclass[11pt]{article}",
        r"\usepackage[margin=2cm]{geometry}",
        r"\usepackage{booktabs,graphicx,pdflscape}",
        r"\begin{document}",
        rf"\section*{{\raggedright Aggregate report: {tex_path(res.run)}}}",
        tex_escape(
            f"Level {level_text(res.level)} for every interval, mark and test decision; "
            f"{res.n_boot} {res.unit} resamples, seed {res.seed}. {multiplicity}"
        ),
        r"\subsection*{Notes}",
        r"\begin{itemize}",
        *(rf"\item {tex_prose(n)}" for n in notes),
        r"\end{itemize}",
        r"\input{tables.tex}",
    ]
    if figures:
        out += [r"\clearpage", r"\section*{Figures}"]
        for name in figures:
            out += [
                r"\begin{figure}[htbp]\centering",
                rf"\includegraphics[width=\linewidth,height=0.85\textheight,keepaspectratio]{{{name}}}",
                rf"\caption{{{tex_escape(FIGURES.get(name.split('.')[0], name))} "
                rf"(\texttt{{{tex_escape(name)}}})}}\label{{fig:harness:{name.split('.')[0]}}}",
                r"\end{figure}",
            ]
    return "\n".join([*out, r"\end{document}"]) + "\n"

"""report/index.html: one self-contained page (inline CSS, plots as data URIs, no scripts).

Sections: notes, the paper-style tables of each view, the trade-off plots, paired
comparisons, the paper's values beside ours, per-token choices of the -min methods (the
paper's Table 3: red = the step tuned for the property g, blue = for the group a), counts.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Any

import polars as pl

from results.tables import (
    TASKS,
    VIEW_TITLES,
    Field,
    counts_table,
    filter_table,
    layout,
    legend,
    paired_table,
)

if TYPE_CHECKING:
    from results.report import AggregateResult

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1300px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
td,th{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
td:first-child,th:first-child,td.t{text-align:left}
thead th{border-bottom:2px solid #999}
tbody.model{border-top:2px solid #999}tbody.model tr.ref{background:#f1f7ff}
.ci{color:#777;font-size:11px}.best{font-weight:bold}.second{text-decoration:underline}
.legend,.run{color:#555}.neg{color:#2166ac}.pos{color:#b2182b}
img{max-width:100%;border:1px solid #eee}
.sample{margin:.4em 0;font-family:ui-monospace,monospace;white-space:pre-wrap}
.meta{color:#777;font-family:system-ui,sans-serif;font-size:12px;margin-right:.6em}
.prompt{color:#555}.tok-g{color:#b2182b;background:#fde0dd}.tok-a{color:#2166ac;background:#deebf7}
"""


def _cell(f: Field, kind: str) -> str:
    if f.value is None:
        return "<td>–</td>"
    text = f"{f.value:.2f}"
    if kind == "score" and f.sd is not None:
        text += f" ± {f.sd:.2f}"
    cls = f' class="{f.mark}"' if f.mark else ""
    ci = ""
    if kind == "bias" and f.low is not None and f.high is not None:
        ci = f' <span class="ci">[{f.low:.2f}, {f.high:.2f}]</span>'
    return f"<td><span{cls}>{text}</span>{ci}</td>"


def paper_table_html(cells: pl.DataFrame, view: str) -> str:
    """The paper-style table of one view, one <tbody> per model."""
    tasks, blocks = layout(cells, view)
    top = "".join(f'<th colspan="3">{TASKS[t][0]}</th>' for t in tasks)
    sub = "".join(
        f"<th>{TASKS[t][1]} {'↑' if TASKS[t][5] else '↓'}</th><th>Bias ↓</th><th>PPL ↓</th>"
        for t in tasks
    )
    out = [
        f'<table class="paper"><thead><tr><th></th>{top}</tr><tr><th>Model / method</th>{sub}</tr></thead>'
    ]
    for block in blocks:
        out.append('<tbody class="model">')
        for row in block.rows:
            kinds = ["score", "bias", "ppl"] * len(tasks)
            tds = "".join(_cell(f, k) for f, k in zip(row.fields, kinds))
            ref = ' class="ref"' if row.method == "vanilla" else ""
            out.append(f"<tr{ref}><td>{html.escape(row.label)}</td>{tds}</tr>")
        out.append("</tbody>")
    return "\n".join(out) + "</table>"


def frame_html(frame: pl.DataFrame, signed: str | None = None) -> str:
    """A plain table; the `signed` column is coloured by sign."""
    if frame.is_empty():
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    body = []
    for row in frame.iter_rows(named=True):
        tds = []
        for col, v in row.items():
            text = "–" if v is None else f"{v:.2f}" if isinstance(v, float) else html.escape(str(v))
            cls = ' class="t"' if isinstance(v, str) else ""
            if col == signed and isinstance(v, float):
                cls = ' class="pos"' if v > 0 else ' class="neg"' if v < 0 else ""
            tds.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def sample_html(row: dict[str, Any]) -> str:
    """One generation with its tokens coloured by the per-step choice (`g` / `a`)."""
    tokens, choices = row.get("tokens") or [], row.get("choices") or []
    spans = []
    for i, tok in enumerate(tokens):
        choice = choices[i] if i < len(choices) else None
        cls = f' class="tok-{choice}"' if choice in ("g", "a") else ""
        spans.append(f"<span{cls}>{html.escape(tok)}</span>")
    meta = html.escape(f"{row['model']} · {row['method']} · {row['task']}")
    prompt = html.escape(str(row.get("prompt") or ""))
    return f'<div class="sample"><span class="meta">{meta}</span><span class="prompt">{prompt}</span>{"".join(spans)}</div>'


def render(res: AggregateResult, images: dict[str, bytes], samples: list[dict[str, Any]]) -> str:
    """The whole page."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>lidao-harness report: {html.escape(res.run)}</title><style>{CSS}</style></head><body>",
        f'<h1>Aggregate report</h1><p class="run">{html.escape(res.run)}</p>',
        '<h2 id="notes">Notes</h2><ul>',
        *(f"<li>{html.escape(n)}</li>" for n in res.notes or ["none"]),
        "</ul>",
    ]
    views = set(res.cells["view"].to_list()) if not res.cells.is_empty() else set()
    for view in (v for v in VIEW_TITLES if v in views):
        parts += [f"<h2>{html.escape(VIEW_TITLES[view])}</h2>"]
        parts += [f'<p class="legend">{html.escape(legend(res.n_boot, res.seed))}</p>']
        parts += [paper_table_html(res.cells, view)]
    parts.append('<h2 id="plots">Fairness–fluency trade-off</h2>')
    for name, png in images.items():
        data = base64.b64encode(png).decode()
        parts.append(
            f'<p><img alt="trade-off plot {html.escape(name)}" src="data:image/png;base64,{data}"></p>'
        )
    if not images:
        parts.append("<p><em>no plot (no paper-style cells)</em></p>")
    parts += ["<h2>Paired comparisons: share of resamples where the method's bias is smaller</h2>"]
    parts += [frame_html(paired_table(res.summary))]
    parts += [
        "<h2>The paper's values beside ours (diff = ours − paper)</h2>",
        frame_html(res.paper, "diff"),
    ]
    parts += ['<h2 id="samples">Per-token choices of the -min methods (the paper\'s Table 3)</h2>']
    parts += [
        '<p class="legend"><span class="tok-g">red: tuned for the property g</span> · <span class="tok-a">blue: tuned for the group a</span></p>'
    ]
    parts += [sample_html(r) for r in samples] or [
        "<p><em>no generations with per-token choices</em></p>"
    ]
    parts += [
        "<h2>Generations and the perplexity filter</h2>",
        frame_html(filter_table(res.summary)),
    ]
    parts += ["<h2>Rows per group</h2>", frame_html(counts_table(res.summary)), "</body></html>"]
    return "\n".join(parts)

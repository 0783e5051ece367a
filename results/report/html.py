"""report/index.html: one self-contained page (inline CSS, plots as data URIs, no scripts): the
run's header and notes, the paper-style tables, the figures, the supplementary tables and the
per-token choices (the paper's Table 3: red = the step tuned for the property g, blue = for the
group a; tokens spaced as the tokenizer decodes them, `results.report.pieces`).
"""

from __future__ import annotations

import base64
import datetime
import html
import re
from typing import TYPE_CHECKING, Any

import polars as pl

from results.report.cells import counts_table, filter_table, paired_table
from results.report.human import human_legend, human_table, styled
from results.report.pieces import model_names, named_models
from results.report.tables import (
    MULTIPLICITY,
    TASKS,
    VIEW_TITLES,
    Layout,
    Style,
    legend,
    level_text,
    p_text,
    table_legend,
)
from results.run.history import harness_version

if TYPE_CHECKING:
    from results.report.result import AggregateResult

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
td,th{padding:3px 5px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
td:first-child,th:first-child,td.t{text-align:left}
thead th{border-bottom:2px solid #999}th[colspan]{text-align:center}
tbody.model{border-top:2px solid #999}tbody.model tr.ref{background:#f1f7ff}
.ci{color:#777;font-size:11px}.best{font-weight:bold}.second{text-decoration:underline}
.nd{color:#555}.sub{display:block;color:#777;font-size:11px}.flag{color:#b2182b}
.other{color:#777;font-size:11px}.wide{overflow-x:auto;max-width:100%}
ul.warn{color:#7a2a12;font-size:12px;margin-top:.2em}
header.top{background:#f6f6f6;border:1px solid #e3e3e3;padding:.6em 1em;border-radius:4px}
header.top dl{display:grid;grid-template-columns:max-content 1fr;gap:.1em 1em;margin:.3em 0}
header.top dt{color:#555}header.top dd{margin:0}
details pre{font-size:12px;background:#fafafa;padding:.6em;overflow-x:auto;max-height:30em}
.legend,.run{color:#555}.neg{color:#2166ac}.pos{color:#b2182b}
img{max-width:100%;border:1px solid #eee}
.sample{margin:.4em 0;font-family:ui-monospace,monospace;white-space:pre-wrap}
.meta{color:#777;font-family:system-ui,sans-serif;font-size:12px;margin-right:.6em}
.prompt{color:#555}.tok-g{color:#b2182b;background:#fde0dd}.tok-a{color:#2166ac;background:#deebf7}
"""


def _html_cell(text: str, mark: str, flags: str, below: list[str]) -> str:
    """A <td>: the value (marked) and its flags, the lines below it in a second line (so the
    table stays narrow)."""
    cls = f' class="{mark}"' if mark in ("best", "second") else ""
    out = f"<span{cls}>{text}</span>"
    if mark == "nd":
        out += ' <span class="nd" title="not distinguishable from the best">n.d.</span>'
    out += f'<sup class="flag">{html.escape(flags)}</sup>' if flags else ""
    out += f'<span class="sub">{" ".join(below)}</span>' if below else ""
    return f"<td>{out}</td>"


HTML = Style(
    _html_cell,
    "other {:.0%}".format,
    "<td>–</td>",
    p=lambda p, marks: p_text(p) + (f'<span class="flag">{marks}</span>' if marks else ""),
    text=html.escape,
)


def paper_table_html(lay: Layout) -> str:
    """The paper-style table of one view, one <tbody> per model, then its warnings."""
    top = "".join(
        f'<th colspan="{sum(c.task == t for c in lay.columns)}">{TASKS[t][0]}</th>'
        for t in lay.tasks
    )
    sub = "".join(
        f"<th>{html.escape(c.header)} {'↑' if c.higher else '↓'}</th>" for c in lay.columns
    )
    out = [
        f'<div class="wide"><table class="paper"><thead><tr><th></th>{top}</tr>'
        f"<tr><th>Model / method</th>{sub}</tr></thead>"
    ]
    kinds = [c.kind for c in lay.columns]
    for block in lay.blocks:
        out.append('<tbody class="model">')
        for row in block.rows:
            tds = "".join(HTML.field(f, k) for f, k in zip(row.fields, kinds))
            ref = ' class="ref"' if row.method == "vanilla" else ""
            out.append(f"<tr{ref}><td>{html.escape(row.label)}</td>{tds}</tr>")
        out.append("</tbody>")
    out.append("</table></div>")
    if lay.warnings:
        out.append('<ul class="warn">')
        out += [f"<li>{html.escape(w)}</li>" for w in lay.warnings]
        out.append("</ul>")
    return "\n".join(out)


def human_html(
    summary: pl.DataFrame, level: float, names: dict[str, str] | None = None
) -> list[str]:
    """The human preference section (nothing without answers)."""
    titles, heads, rows = human_table(summary, level, names)
    if not rows:
        return []
    top = "".join(f'<th colspan="5">{html.escape(t)}</th>' for t in titles)
    out = [
        '<h2 id="human">Human preference</h2>',
        f'<p class="legend">{html.escape(human_legend(level))}</p>',
        f'<div class="wide"><table class="human"><thead><tr><th></th>{top}</tr>',
        "<tr><th>Model (task), criterion</th>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in heads)
        + "</tr></thead><tbody>",
    ]
    for label, pooled, cells in rows:
        tds = "".join(styled(cells, HTML, html.escape))
        out.append(f"<tr{' class=ref' if pooled else ''}><td>{html.escape(label)}</td>{tds}</tr>")
    return [*out, "</tbody></table></div>"]


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
    return (
        f'<div class="wide"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def sample_html(row: dict[str, Any]) -> str:
    """One generation with its tokens coloured by the per-step choice (`g` / `a`)."""
    tokens, choices = row.get("pieces") or row.get("tokens") or [], row.get("choices") or []
    spans = []
    for i, tok in enumerate(tokens):
        choice = choices[i] if i < len(choices) else None
        cls = f' class="tok-{choice}"' if choice in ("g", "a") else ""
        spans.append(f"<span{cls}>{html.escape(tok)}</span>")
    meta = html.escape(f"{row.get('model_name') or row['model']} · {row['method']} · {row['task']}")
    prompt = html.escape(str(row.get("prompt") or ""))
    return f'<div class="sample"><span class="meta">{meta}</span><span class="prompt">{prompt}</span>{"".join(spans)}</div>'


def header_html(res: AggregateResult) -> str:
    """Run, harness version, date, aggregation settings, groups and the config (folded)."""
    import yaml

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    settings = ", ".join(f"{k} = {v}" for k, v in res.settings.items()) or "defaults"
    items = {
        "run": res.run,
        "config": str((res.config or {}).get("name", "–")),
        "harness": harness_version(),
        "aggregated": now,
        "aggregation": settings,
        "groups": ", ".join(res.groups) or "the labels seen",
        "resampling unit": res.unit,
        "level": f"{level_text(res.level)} (every interval, mark and test decision)",
    }
    rows = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items.items()
    )
    config = yaml.safe_dump(res.config, sort_keys=False) if res.config else "(no config.yaml)"
    return (
        f'<header class="top"><dl>{rows}</dl><details><summary>config.yaml</summary>'
        f"<pre>{html.escape(config)}</pre></details></header>"
    )


def prose_html(text: str) -> str:
    """Escaped prose whose `name` spans (markdown code, as in tables.md) become <code>."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html.escape(text))


EVALUATION_NOTES = (
    "Groups come from the config (the seed words' groups). A text's group is the group with the "
    "strict plurality of seed-word matches; ties and texts without seed words are `none` "
    "(for K = 2 this is the majority rule of the paper). A configured group without rows keeps "
    "its row (count 0) and makes every gap over it undefined, with the reason in the notes. "
    "Scores that are not finite (NaN, inf) are errors, counted as missing. "
    "Gap intervals are percentile intervals of the bootstrap over whole pairs (paired prompt "
    "files) or prompts; p-values test no group difference (docs/statistics.md says which test, "
    "on which unit). "
)


def render(
    res: AggregateResult,
    images: dict[str, bytes],
    samples: list[dict[str, Any]],
    layouts: dict[str, Layout],
) -> str:
    """The whole page (`layouts`: the paper-style layout of each view)."""
    at = level_text(res.level)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>lidao-harness report: {html.escape(res.run)}</title><style>{CSS}</style></head><body>",
        "<h1>Aggregate report</h1>",
        header_html(res),
        '<h2 id="notes">Notes</h2><ul>',
        *(f"<li>{prose_html(n)}</li>" for n in res.notes or ["none"]),
        "</ul>",
        f'<p class="legend">{prose_html(EVALUATION_NOTES + MULTIPLICITY)}</p>',
    ]
    if layouts:
        text = legend(res.n_boot, res.seed, res.unit, res.level, res.groups)
        parts += [f'<h2>How to read the tables</h2><p class="legend">{prose_html(text)}</p>']
    for i, (view, lay) in enumerate(layouts.items(), 1):
        parts += [
            f"<h2>Table {i} — {html.escape(VIEW_TITLES[view])} (level {at})</h2>",
            f'<p class="legend">{prose_html(table_legend(lay))}</p>',
            paper_table_html(lay),
        ]

    def img(name: str, alt: str) -> str:
        data = base64.b64encode(images[name]).decode()
        return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'

    tradeoffs = [img(n, f"trade-off plot {n}") for n in images if n.startswith("tradeoff")]
    parts += [
        *human_html(res.summary, res.level, model_names(res.config)),
        f'<h2 id="forest">Bias of each method with its {at} interval</h2>',
        img("forest.png", "forest plot of the biases")
        if "forest.png" in images
        else "<p><em>no bias to plot (no paper-style cells)</em></p>",
        '<h2 id="plots">Fairness–fluency trade-off</h2>',
        *(
            tradeoffs
            or [
                "<p><em>no trade-off plot: no perplexity was measured (the forest plot above shows the biases)</em></p>"
            ]
        ),
        "<h2>Paired comparisons: |gap| − the reference's |gap| (Bias, Bias cm) over the same resamples "
        f"(level {at})</h2>",
        frame_html(named_models(paired_table(res.summary), model_names(res.config)), "diff"),
        "<h2>The paper's values beside ours (diff = ours − paper)</h2>",
        frame_html(res.paper, "diff"),
        '<h2 id="samples">Per-token choices (the paper\'s Table 3)</h2>',
        '<p class="legend"><span class="tok-g">red: tuned for the property g</span> · <span class="tok-a">blue: tuned for the group a</span></p>',
        *(
            [sample_html(r) for r in samples]
            or ["<p><em>no generations with per-token choices</em></p>"]
        ),
        "<h2>Generations and the perplexity filter</h2>",
        frame_html(named_models(filter_table(res.summary), model_names(res.config))),
        "<h2>Rows per group</h2>",
        frame_html(named_models(counts_table(res.summary), model_names(res.config))),
        "</body></html>",
    ]
    return "\n".join(parts)

"""`aggregate_run`, the I/O entry of aggregation, and the Markdown / LaTeX reports.

Writes RUN/summary.parquet and summary.csv (the long summary, `results.aggregate`) and
RUN/report/: tables.md, tables.tex (paper layout, `results.tables`; best bold, second
underlined), tradeoff*.png (`results.plot`) and index.html (`results.report_html`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from results import report_html
from results.aggregate import summarize
from results.join import join_run
from results.paper import compare_with_paper
from results.plot import forest_png, tradeoff_png
from results.store import RunStore
from results.tables import (
    TASKS,
    VIEW_TITLES,
    Field,
    Samples,
    counts_table,
    filter_table,
    layout,
    legend,
    ordered,
    paired_table,
    table_cells,
)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def md_field(f: Field) -> str:
    text = _num(f.value)
    if f.value is not None and f.sd is not None:
        text += f" ± {f.sd:.2f}"
    if f.value is not None and f.other is not None:
        text += f" (other {f.other:.0%})"
    if f.value is not None and f.low is not None and f.high is not None:
        text += f" [{f.low:.2f}, {f.high:.2f}]"
    return {"best": f"**{text}**", "second": f"<u>{text}</u>", "tie": f"{text} ≈"}.get(f.mark, text)


def markdown_table(cells: pl.DataFrame, view: str, samples: Samples | None = None) -> str:
    tasks, blocks = layout(cells, view, samples)
    if not blocks:
        return f"_No cells for view {view}._\n"
    head = ["Model / method"]
    for t in tasks:
        name, score, *_, higher = TASKS[t]
        head += [f"{name}: {score} {'↑' if higher else '↓'}", "Bias ↓", "PPL ↓"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for block in blocks:
        for row in block.rows:
            lines.append("| " + " | ".join([row.label, *(md_field(f) for f in row.fields)]) + " |")
    return "\n".join(lines) + "\n"


def tex_escape(text: str) -> str:
    """Plain text for LaTeX: specials escaped, the report's few non-ASCII signs as macros."""
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("_", r"\_"),
        ("#", r"\#"),
        ("$", r"\$"),
        ("±", r"$\pm$"),  # after "$": these add math mode on purpose
        ("×", r"$\times$"),
        ("—", "---"),
        ("–", "--"),
    ):
        text = text.replace(a, b)
    return text


def tex_field(f: Field) -> str:
    text = "-" if f.value is None else f"{f.value:.2f}"
    if f.value is not None and f.sd is not None:
        text += f"$\\pm${f.sd:.2f}"
    if f.mark == "tie":
        text += r"$\approx$"
    elif f.mark:
        text = (r"\textbf{%s}" if f.mark == "best" else r"\underline{%s}") % text
    if f.value is not None and f.low is not None and f.high is not None:
        text += f" {{\\scriptsize [{f.low:.2f}, {f.high:.2f}]}}"
    return text


def latex_table(
    cells: pl.DataFrame, view: str, caption: str, samples: Samples | None = None
) -> str:
    """A booktabs `table*` like the paper's (needs booktabs)."""
    tasks, blocks = layout(cells, view, samples)
    if not blocks:
        return f"% no cells for view {view}\n"
    spec = "@{}l " + " c ".join("ccc" for _ in tasks) + "@{}"
    top = " & & ".join(rf"\multicolumn{{3}}{{c}}{{{TASKS[t][0]}}}" for t in tasks)
    rules = " ".join(rf"\cmidrule{{{2 + 4 * i}-{4 + 4 * i}}}" for i in range(len(tasks)))
    arrows = [
        f"{TASKS[t][1]} ($\\{'uparrow' if TASKS[t][5] else 'downarrow'}$) & Bias ($\\downarrow$) & PPL ($\\downarrow$)"
        for t in tasks
    ]
    out = [
        r"\begin{table*}[htb!]",
        r"\centering",
        rf"\caption{{{caption}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
    ]
    out += [f" & {top} \\\\", rules, " & " + " & & ".join(arrows) + r" \\", r"\midrule"]
    for b, block in enumerate(blocks):
        for row in block.rows:
            groups = [
                " & ".join(tex_field(f) for f in row.fields[3 * i : 3 * i + 3])
                for i in range(len(tasks))
            ]
            out.append(tex_escape(row.label) + " & " + " & & ".join(groups) + r" \\")
        out.append(r"\midrule" if b < len(blocks) - 1 else r"\bottomrule")
    return "\n".join(out + [r"\end{tabular}", r"\end{table*}"]) + "\n"


def frame_markdown(frame: pl.DataFrame) -> str:
    """A plain Markdown table of `frame` (floats with 2 decimals, nulls as –)."""
    if frame.is_empty():
        return "_none_\n"
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * frame.width]
    for row in frame.iter_rows():
        cells = ["–" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_report(res: AggregateResult) -> str:
    """report/tables.md: notes, one paper-style table per view, counts, comparisons."""
    views = (
        [v for v in VIEW_TITLES if v in set(res.cells["view"].to_list())]
        if not res.cells.is_empty()
        else []
    )
    out = [f"# Aggregate report: {res.run}", "", "## Notes", ""]
    out += [f"- {n}" for n in res.notes] or ["- none"]
    for view in views:
        out += [
            "",
            f"## {VIEW_TITLES[view]}",
            "",
            legend(res.n_boot, res.seed, res.unit, res.level, res.groups),
            "",
            markdown_table(res.cells, view, res.samples),
        ]
    out += ["", "## Paired comparisons: |bias| − the reference's |bias| (same resamples)", ""]
    out += [frame_markdown(paired_table(res.summary))]
    out += ["", "## The paper's values beside ours", "", frame_markdown(res.paper)]
    out += [
        "",
        "## Generations and the perplexity filter",
        "",
        frame_markdown(filter_table(res.summary)),
    ]
    out += ["", "## Rows per group", "", frame_markdown(counts_table(res.summary))]
    return "\n".join(out)


def latex_report(res: AggregateResult) -> str:
    parts = [f"% lidao-harness tables of {tex_escape(res.run)}; needs \\usepackage{{booktabs}}\n"]
    for view in VIEW_TITLES:
        if not res.cells.is_empty() and view in set(res.cells["view"].to_list()):
            text = legend(res.n_boot, res.seed, res.unit, res.level, res.groups)
            caption = tex_escape(f"{VIEW_TITLES[view]}. {text}")
            parts.append(latex_table(res.cells, view, caption, res.samples))
    return "\n".join(parts)


@dataclass
class AggregateResult:
    """What `aggregate_run` computed and wrote (`paths`: name → written path)."""

    run: str
    summary: pl.DataFrame
    cells: pl.DataFrame
    paper: pl.DataFrame
    notes: list[str]
    seed: int
    n_boot: int
    paths: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # the aggregation settings used
    config: dict[str, Any] = field(default_factory=dict)  # the run's config.yaml
    samples: Samples = field(default_factory=dict)  # bootstrap gaps (`Aggregate.samples`)
    unit: str = "prompt"  # resampling unit: pair or prompt
    groups: tuple[str, ...] = ()

    @property
    def level(self) -> float:
        return float(self.settings.get("level", 0.95))

    def __str__(self) -> str:
        lines = [f"aggregated {self.run}: {self.summary.height} summary rows"]
        lines += [f"  wrote {p}" for p in self.paths.values()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _sample_rows(
    frame: pl.DataFrame, store: RunStore | None = None, per_cell: int = 3
) -> list[dict[str, Any]]:
    """A few generations with per-token choices per model/method/task (every method that
    records them), each with `pieces`: its tokens as the tokenizer spaces them."""
    if "choices" not in frame.columns:
        return []
    rows = frame.filter(pl.col("choices").is_not_null() & (pl.col("choices").list.len() > 0))
    cols = ["model", "method", "task", "job_id", "prompt", "tokens", "choices"]
    cols += [c for c in ("token_ids", "continuation", "model_revision") if c in frame.columns]
    picked = (
        rows.sort("job_id")
        .group_by(["model", "method", "task"], maintain_order=True)
        .head(per_cell)
    )
    samples = picked.select(cols).sort(["model", "method", "task", "job_id"]).to_dicts()
    return report_html.with_pieces(samples)


DEFAULTS = {"ppl_max": 200.0, "n_boot": 1000, "n_perm": 200, "seed": 0, "level": 0.95}


@dataclass
class RunSettings:
    """What aggregation takes from the run's config.yaml (defaults where absent)."""

    aggregation: dict[str, Any]
    groups: tuple[str, ...] | None  # the configured demographic groups, in order
    config: dict[str, Any]  # the raw config (for the report's header)
    notes: list[str]


def run_settings(store: RunStore) -> RunSettings:
    """The `aggregation:` section and the demographic groups of the run's config.yaml.

    Groups: those of the seed words (`gender_words`, built-in: female, male), the groups of
    the gender labels; read as plain YAML, so a config of an older harness still aggregates.
    """
    import yaml

    notes: list[str] = []
    if not store.exists("config.yaml"):
        return RunSettings(dict(DEFAULTS), None, {}, ["no config.yaml: groups are the labels seen"])
    raw = yaml.safe_load(store.read_text("config.yaml")) or {}
    agg = {**DEFAULTS, **{k: v for k, v in (raw.get("aggregation") or {}).items() if k in DEFAULTS}}
    groups: tuple[str, ...] | None = ("female", "male")
    if raw.get("gender_words") not in (None, "builtin"):
        from jobs.words import load_group_words

        try:
            words = load_group_words(
                raw["gender_words"],
                sha256=raw.get("gender_words_sha256"),
                cache_dir=(raw.get("runtime") or {}).get("cache_dir"),
            )
            groups = tuple(words.groups)
        except (OSError, ValueError) as exc:
            groups = None
            notes.append(f"cannot read the seed words' groups ({exc}); groups are the labels seen")
    files = (raw.get("dataset") or {}).get("files") or {}
    if groups and files and set(files) != set(groups):
        notes.append(
            f"the prompt files' groups {sorted(files)} differ from the label groups "
            f"{list(groups)}: in the `file` view the others count as `none`"
        )
    return RunSettings(agg, groups, raw, notes)


def empty_reason(summary: pl.DataFrame) -> str:
    """Why no paper-style table: no task of the paper, no scores, or the filter dropped all."""
    tasks = set(summary["task"].to_list()) if not summary.is_empty() else set()
    known = sorted(tasks & set(TASKS))
    if not known:
        return (
            f"no task among sentiment/regard/toxicity in the run (tasks: {sorted(tasks) or 'none'})"
        )
    filt = summary.filter(pl.col("metric") == "filter")
    gens = int(filt.filter(pl.col("stat") == "generations")["value"].sum() or 0)
    dropped = filt.filter(pl.col("stat").str.starts_with("dropped_ppl>"))
    n_drop = int(dropped["value"].sum() or 0)
    if gens and n_drop == gens:
        limit = dropped["stat"][0].split(">", 1)[1]
        return (
            f"the perplexity > {limit} filter dropped all {gens} generations: no paper-style "
            "tables (raise aggregation.ppl_max or pass --ppl-max)"
        )
    return "no scored rows of the tasks' metrics: no paper-style tables"


def aggregate_run(
    store: RunStore,
    scorers: dict[str, str] | None = None,
    seed: int | None = None,
    n_boot: int | None = None,
    ppl_max: float | None = None,
    groups: Sequence[str] | None = None,
    level: float | None = None,
) -> AggregateResult:
    """Join, aggregate and write summary.parquet/.csv and report/ (tables, plot, HTML).

    Args:
        store: the run directory (needs generations; scores are used where present).
        scorers: metric → scorer name where two scorers gave one metric.
        seed, n_boot, ppl_max, level: override the config's `aggregation:` (defaults 0,
            1000, 200, 0.95).
        groups: the demographic groups (default: the config's, else the labels seen).

    Returns:
        The summary, paper-style cells, paper comparison, notes (what is missing or was
        skipped) and the written paths.
    """
    settings = run_settings(store)
    agg_cfg = dict(settings.aggregation)
    given = {"seed": seed, "n_boot": n_boot, "ppl_max": ppl_max, "level": level}
    agg_cfg.update({k: v for k, v in given.items() if v is not None})
    joined = join_run(store, scorers)
    agg = summarize(
        joined.frame,
        joined.failed,
        groups=groups if groups is not None else settings.groups,
        seed=int(agg_cfg["seed"]),
        n_boot=int(agg_cfg["n_boot"]),
        level=float(agg_cfg["level"]),
        ppl_max=float(agg_cfg["ppl_max"]),
        n_perm=min(int(agg_cfg["n_perm"]), int(agg_cfg["n_boot"])),
    )
    cells = table_cells(agg.summary)
    ppl_rows = agg.summary.filter(pl.col("metric") == "perplexity")["scorer_version"].drop_nulls()
    paper = ordered(compare_with_paper(cells, ppl_rows[0] if len(ppl_rows) else None))
    res = AggregateResult(
        store.uri,
        agg.summary,
        cells,
        paper,
        settings.notes + joined.notes + agg.notes,
        int(agg_cfg["seed"]),
        int(agg_cfg["n_boot"]),
        settings=agg_cfg,
        config=settings.config,
        samples=agg.samples,
        unit=units[0]
        if len(units := agg.summary["resample_unit"].drop_nulls().unique())
        else "prompt",
        groups=agg.groups,
    )
    if cells.is_empty() or cells["bias"].is_null().all() and cells["score"].is_null().all():
        res.notes.append(empty_reason(agg.summary))
    res.paths["summary.parquet"] = store.write_table("summary.parquet", agg.summary.to_arrow())
    buf = io.BytesIO()
    agg.summary.write_csv(buf)
    res.paths["summary.csv"] = store.write_bytes("summary.csv", buf.getvalue())
    res.paths["tables.md"] = store.write_bytes("report/tables.md", markdown_report(res).encode())
    res.paths["tables.tex"] = store.write_bytes("report/tables.tex", latex_report(res).encode())
    images = {}
    for view, name in (("a(x)", "tradeoff.png"), ("a(c,x)", "tradeoff_acx.png")):
        in_view = cells.filter(pl.col("view") == view) if not cells.is_empty() else cells
        if not in_view.is_empty() and in_view["ppl"].is_not_null().any():
            images[name] = tradeoff_png(cells, view)
            res.paths[name] = store.write_bytes(f"report/{name}", images[name])
    if not cells.is_empty() and cells["bias"].is_not_null().any():
        images["forest.png"] = forest_png(cells)
        res.paths["forest.png"] = store.write_bytes("report/forest.png", images["forest.png"])
    html = report_html.render(res, images, _sample_rows(joined.frame, store))
    res.paths["index.html"] = store.write_bytes("report/index.html", html.encode())
    return res

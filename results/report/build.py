"""`aggregate_run`, the I/O entry of aggregation: RUN/summary.parquet and summary.csv (the long
summary, `results.stats.aggregate`) and RUN/report/ (tables.md, written here; tables.tex and
report.tex, `tex`; the figures, `plot`; index.html, `html`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from jobs.redact import spreadsheet_safe
from results.human import human_rows
from results.report import html as report_html
from results.report.cells import counts_table, filter_table, ordered, paired_table, table_cells
from results.report.human import human_legend, human_table, md_text, styled
from results.report.paper import compare_with_paper
from results.report.pieces import (
    TokenizerFor,
    model_label,
    model_names,
    named_models,
    with_model_names,
    with_pieces,
)
from results.report.plot import figure_files, forest_figure, tradeoff_figure
from results.report.result import AggregateResult
from results.report.tables import (
    FEW,
    FEW_UNITS,
    MISSING,
    MULTIPLICITY,
    TASKS,
    VIEW_TITLES,
    Layout,
    Style,
    layout,
    legend,
    level_text,
    md_lines,
    table_legend,
)
from results.report.tex import human_latex, latex_document, latex_tables
from results.run.store import RunStore
from results.stats.aggregate import READ_COLUMNS, Aggregate, summarize
from results.stats.join import JoinedRun, join_run


def _md_cell(text: str, mark: str, flags: str, below: list[str]) -> str:
    marked = {"best": f"**{text}**", "second": f"<u>{text}</u>", "nd": f"{text} (n.d.)"}
    return marked.get(mark, text) + flags + "".join(f" {b}" for b in below)


MARKDOWN = Style(_md_cell, "(other {:.0%})".format)


def markdown_table(lay: Layout) -> str:
    """A view's paper-style table, then its warnings (one bullet per flagged cell)."""
    if not lay.blocks:
        return "_No cells for this view._\n"
    head = [f"{TASKS[c.task][0]}: {c.header} {'↑' if c.higher else '↓'}" for c in lay.columns]
    kinds = [c.kind for c in lay.columns]
    rows = [
        [row.label, *(MARKDOWN.field(f, k) for f, k in zip(row.fields, kinds))]
        for block in lay.blocks
        for row in block.rows
    ]
    lines = md_lines([["Model / method", *head], *rows])
    if lay.warnings:
        lines += ["", "Warnings:", "", *(f"- {w}" for w in lay.warnings)]
    return "\n".join(lines) + "\n"


def frame_markdown(frame: pl.DataFrame) -> str:
    """A plain Markdown table of `frame` (floats with 2 decimals, nulls as –)."""
    if frame.is_empty():
        return "_none_\n"
    rows = [
        ["–" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v) for v in row]
        for row in frame.iter_rows()
    ]
    return "\n".join(md_lines([frame.columns, *rows])) + "\n"


def human_markdown(
    summary: pl.DataFrame, level: float, names: dict[str, str] | None = None
) -> list[str]:
    """The human preference section of tables.md (no lines without answers)."""
    titles, heads, rows = human_table(summary, level, names)
    if not rows:
        return []
    head = [f"{titles[i // 5]}: {h}" for i, h in enumerate(heads)]
    body = [[md_text(label), *styled(cells, MARKDOWN)] for label, _, cells in rows]
    lines = md_lines([["Model (task), criterion", *head], *body])
    return ["", "## Human preference", "", human_legend(level), "", *lines]


def view_layouts(res: AggregateResult) -> dict[str, Layout]:
    """The paper-style layout of every view with cells, in report order, at the run's level."""
    views = set(res.cells["view"].to_list()) if not res.cells.is_empty() else set()
    return {
        v: layout(res.cells, v, res.samples, res.level, res.unit, res.samples_cm)
        for v in VIEW_TITLES
        if v in views
    }


def markdown_report(res: AggregateResult, layouts: dict[str, Layout] | None = None) -> str:
    """report/tables.md: notes, one paper-style table per view, counts, comparisons."""
    layouts = view_layouts(res) if layouts is None else layouts
    at = level_text(res.level)
    out = [f"# Aggregate report: {res.run}", "", f"Level: {at}.", "", "## Notes", ""]
    out += [f"- {n}" for n in res.notes] or ["- none"]
    if layouts:
        text = legend(res.n_boot, res.seed, res.unit, res.level, res.groups, MULTIPLICITY)
        out += ["", "## How to read the tables", "", text]
    for i, (view, lay) in enumerate(layouts.items(), 1):
        out += ["", f"## Table {i} — {VIEW_TITLES[view]} (level {at})", "", table_legend(lay)]
        out += ["", markdown_table(lay)]
    names = model_names(res.config)
    out += human_markdown(res.summary, res.level, names)
    for title, frame in {
        f"Paired comparisons: |gap| − the reference's |gap| (Bias, Bias cm; same resamples, level {at})": paired_table(
            res.summary
        ),
        "The paper's values beside ours": res.paper,
        "Generations and the perplexity filter": filter_table(res.summary),
        "Rows per group": counts_table(res.summary),
    }.items():
        out += ["", f"## {title}", "", frame_markdown(named_models(frame, names))]
    return "\n".join(out)


def _sample_rows(
    store: RunStore,
    ids: pl.Series,
    tokenizer_for: TokenizerFor | None = None,
    per_cell: int = 3,
) -> list[dict[str, Any]]:
    """A few ok generations (`ids`) with per-token choices per model/method/task (every method
    that records them), each with `pieces`: its tokens as the tokenizer spaces them. Read a
    batch at a time: a run's texts and tokens never sit in memory whole."""
    keys = ["model", "method", "task"]
    cols = [*keys, "job_id", "prompt", "tokens", "choices", "token_ids", "continuation"]
    picked = None
    for batch in store.iter_generations([*cols, "model_revision", "status"], 50_000):
        ok = (pl.col("status") == "ok") & (pl.col("choices").list.len() > 0)  # (null: dropped)
        rows = batch.filter(ok & pl.col("job_id").is_in(ids.implode())).drop("status")
        if rows.height:
            both = rows if picked is None else pl.concat([picked, rows])
            picked = both.sort("job_id").group_by(keys, maintain_order=True).head(per_cell)
    if picked is None:
        return []
    return with_pieces(picked.sort([*keys, "job_id"]).to_dicts(), tokenizer_for)


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
    from results.run.identity import read_config

    notes: list[str] = []
    raw = read_config(store)
    if raw is None:
        return RunSettings(dict(DEFAULTS), None, {}, ["no config.yaml: groups are the labels seen"])
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


def _handed(joined: JoinedRun) -> pl.DataFrame:
    """`joined.frame`, left in `joined` as its job ids only: the call it is passed to then
    holds its one reference (CPython hands the arguments over), and `summarize` frees the
    rows and columns it does not keep (~0.5 GB at 1M rows)."""
    frame, joined.frame = joined.frame, joined.frame.select("job_id")
    return frame


def summarize_joined(
    joined: JoinedRun,
    cfg: dict[str, Any],
    groups: Sequence[str] | None,
    units: dict[tuple[str, str], Sequence[str]] | None = None,
    paired: bool | None = None,
    release: bool = False,
) -> Aggregate:
    """`summarize` of a joined run with the aggregation settings `cfg` (`RunSettings`'
    `aggregation`, overridden): permutations at most as many as resamples. `release`: hand the
    frame over (`_handed`: `joined.frame` keeps only its job ids afterwards)."""
    n_boot = int(cfg["n_boot"])
    return summarize(
        _handed(joined) if release else joined.frame,
        joined.failed,
        groups=groups,
        seed=int(cfg["seed"]),
        n_boot=n_boot,
        level=float(cfg["level"]),
        ppl_max=float(cfg["ppl_max"]),
        n_perm=min(int(cfg["n_perm"]), n_boot),
        units=units,
        paired=paired,
    )


def aggregate_run(
    store: RunStore,
    scorers: dict[str, str] | None = None,
    seed: int | None = None,
    n_boot: int | None = None,
    ppl_max: float | None = None,
    groups: Sequence[str] | None = None,
    level: float | None = None,
    tokenizer_for: TokenizerFor | None = None,
) -> AggregateResult:
    """Join, aggregate and write summary.parquet/.csv and report/ (tables, plot, HTML).

    Args:
        store: the run directory (needs generations; scores are used where present).
        scorers: metric → scorer name where two scorers gave one metric.
        seed, n_boot, ppl_max, level: override the config's `aggregation:` (defaults 0,
            1000, 200, 0.95).
        groups: the demographic groups (default: the config's, else the labels seen).
        tokenizer_for: (model, revision) → the model's `tokenizers.Tokenizer` or None, to
            space the report's sample tokens (default: `results.report.pieces.cached_tokenizer`).

    Returns:
        The summary, paper-style cells, paper comparison, notes (what is missing or was
        skipped) and the written paths.
    """
    settings = run_settings(store)
    given = {"seed": seed, "n_boot": n_boot, "ppl_max": ppl_max, "level": level}
    cfg = {**settings.aggregation, **{k: v for k, v in given.items() if v is not None}}
    seed, n_boot, level = int(cfg["seed"]), int(cfg["n_boot"]), float(cfg["level"])
    joined = join_run(store, scorers, READ_COLUMNS)
    groups = groups if groups is not None else settings.groups
    agg = summarize_joined(joined, cfg, groups, release=True)
    names = model_names(settings.config)
    cells = with_model_names(table_cells(agg.summary), names)
    ppl_rows = agg.summary.filter(pl.col("metric") == "perplexity")["scorer_version"].drop_nulls()
    paper = ordered(compare_with_paper(cells, ppl_rows[0] if len(ppl_rows) else None))
    units = agg.summary["resample_unit"].drop_nulls().unique()
    res = AggregateResult(
        store.uri,
        pl.concat([agg.summary, human_rows(store, seed, n_boot, level)]),
        cells,
        paper,
        settings.notes + joined.notes + agg.notes,
        seed,
        n_boot,
        settings=cfg,
        config=settings.config,
        samples=agg.samples,
        samples_cm=agg.samples_cm,
        unit=units[0] if len(units) else "prompt",
        groups=agg.groups,
    )
    if cells.is_empty() or cells["bias"].is_null().all() and cells["score"].is_null().all():
        res.notes.append(empty_reason(agg.summary))
    res.notes += [
        f"{model_label(m, names)} has random weights ({m}): its numbers test the harness, not "
        "a method; real text needs a pretrained model (examples/quickstart.yaml runs SmolLM2)"
        for m in sorted(set(agg.summary["model"].drop_nulls().to_list()))
        if m.startswith("tiny-random/")
    ]
    res.paths["summary.parquet"] = store.write_table("summary.parquet", res.summary.to_arrow())
    res.paths["summary.csv"] = store.write_bytes(
        "summary.csv", spreadsheet_safe(res.summary).write_csv().encode()
    )
    samples = _sample_rows(store, joined.frame["job_id"], tokenizer_for)
    write_report(store, res, [{**r, "model_name": model_label(r["model"], names)} for r in samples])
    return res


def warning_notes(layouts: dict[str, Layout]) -> list[str]:
    """The tables' warnings in short, for the notes (the counts are under each table)."""
    lost = {v: sum(w.startswith(MISSING) for w in lay.warnings) for v, lay in layouts.items()}
    few = [v for v, lay in layouts.items() if any(w.startswith(FEW) for w in lay.warnings)]
    notes = []
    if any(lost.values()):
        per_view = ", ".join(f"{v}: {k}" for v, k in lost.items() if k)
        notes.append(
            f"{MISSING} missing or failed scores, unlabelled rows or failed generations in "
            f"{sum(lost.values())} table cells ({per_view}); counts per group under each table"
        )
    if few:
        notes.append(
            f"{FEW} gaps on fewer than {FEW_UNITS} resampling units in view(s) {', '.join(few)}: "
            "their intervals and p-values are unreliable"
        )
    return notes


def write_report(store: RunStore, res: AggregateResult, samples: list[dict[str, Any]]) -> None:
    """report/: tables.md, tables.tex + report.tex, the figures (PNG, PDF, SVG), index.html.
    The tables' warnings are added to `res.notes` in short."""
    layouts = view_layouts(res)
    res.notes.extend(warning_notes(layouts))
    cells = res.cells

    def put(name: str, data: bytes) -> None:
        res.paths[name] = store.write_bytes(f"report/{name}", data)

    put("tables.md", markdown_report(res, layouts).encode())
    figures = {}
    for view, name in (("a(x)", "tradeoff"), ("a(c,x)", "tradeoff_acx")):
        in_view = cells.filter(pl.col("view") == view) if not cells.is_empty() else cells
        if not in_view.is_empty() and in_view["ppl"].is_not_null().any():
            figures[name] = tradeoff_figure(cells, view, res.level)
    if not cells.is_empty() and cells["bias"].is_not_null().any():
        figures["forest"] = forest_figure(cells, res.level)
    images = {}
    for name, fig in figures.items():
        files = figure_files(fig)
        for fmt, data in files.items():
            put(f"{name}.{fmt}", data)
        images[f"{name}.png"] = files["png"]
    tables = latex_tables(res, layouts, MULTIPLICITY) + human_latex(
        res.summary, res.level, model_names(res.config)
    )
    put("tables.tex", tables.encode())
    pdfs = [f"{n}.pdf" for n in ("forest", "tradeoff", "tradeoff_acx") if n in figures]
    put("report.tex", latex_document(res, pdfs, MULTIPLICITY).encode())
    put("index.html", report_html.render(res, images, samples, layouts).encode())

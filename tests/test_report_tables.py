"""Report tables: what `aggregate_run` writes, the paper-style tables (marks of best and second
from the resampled intervals, LaTeX rows), the cells they show, and the paper's numbers beside
ours. `report_run` (tests/conftest.py) is a synthetic run aggregated as the driver does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from results.report.build import markdown_table
from results.report.cells import paired_table, table_cells
from results.report.paper import load_paper_tables
from results.report.tables import _marks, layout
from results.report.tex import latex_table

SHARED = Path(__file__).resolve().parents[2] / "shared"


def cells_frame(rows: list[tuple[str, str, float | None, float | None]]) -> pl.DataFrame:
    """Cells of one model/task/view: (model, method, bias, ppl)."""
    return pl.DataFrame(
        [
            {"model": m, "method": meth, "variant": "", "task": "sentiment", "view": "a(x)", "score": 0.5,
             "score_sd": 0.1, "bias": b, "bias_low": None, "bias_high": None, "ppl": p}
            for m, meth, b, p in rows
        ],
        schema_overrides={"bias": pl.Float64, "ppl": pl.Float64, "bias_low": pl.Float64, "bias_high": pl.Float64},
    )  # fmt: skip


# ---- aggregate_run ---------------------------------------------------------------------------


def test_aggregate_run_writes_every_output(report_run: Any) -> None:
    figures = {
        f"{n}.{fmt}"
        for n in ("forest", "tradeoff", "tradeoff_acx")
        for fmt in ("png", "pdf", "svg")
    }
    assert set(report_run.paths) == {
        "summary.parquet", "summary.csv", "tables.md", "tables.tex", "report.tex", "index.html",
    } | figures  # fmt: skip
    assert pl.read_parquet(report_run.paths["summary.parquet"]).equals(report_run.summary)
    assert pl.read_csv(report_run.paths["summary.csv"]).height == report_run.summary.height
    md = Path(report_run.paths["tables.md"]).read_text()
    assert "## Table 1 — bias over the gender of the continuation, a(x)" in md
    assert "| +LIDAO-m |" in md and "| GPT-2 vanilla |" in md


def _samples(biases: dict[str, float], sd: float, seed: int = 0) -> dict[Any, Any]:
    """Bootstrap gaps of one (model, task, view) cell per method: the bias ± normal noise that
    all methods share (same resamples) plus a little of their own."""
    import numpy as np

    rng = np.random.default_rng(seed)
    common = rng.normal(0, sd, 400)
    cells = {
        (m, ""): np.concatenate([[b], b + common + rng.normal(0, sd / 4, 400)])
        for m, b in biases.items()
    }
    return {("gpt2-large", "sentiment", "a(x)", "sentiment"): cells}


def test_tables_mark_best_and_second_only_where_the_interval_says_so() -> None:
    cells = cells_frame([
        ("gpt2-large", "vanilla", 0.5, 10.0),  # best numbers, but the reference row is not ranked
        ("gpt2-large", "uddia", 3.0, 30.0),
        ("gpt2-large", "lidao-min", -1.0, 40.0),  # |bias| ranks: a negative gap of 1 is small
        ("gpt2-large", "pplm", 2.0, None),
    ])  # fmt: skip
    biases = {"vanilla": 0.5, "uddia": 3.0, "lidao-min": -1.0, "pplm": 2.0}
    blocks = layout(cells, "a(x)", _samples(biases, sd=0.1)).blocks  # clear differences
    marks = {r.method: (r.fields[1].mark, r.fields[2].mark) for r in blocks[0].rows}
    assert marks == {
        "vanilla": ("", ""),
        "pplm": ("second", ""),
        "uddia": ("", "best"),
        "lidao-min": ("best", "second"),
    }
    assert [r.label for r in blocks[0].rows] == ["GPT-2 vanilla", "+PPLM", "+UDDIA", "+LIDAO-m"]
    md = markdown_table(layout(cells, "a(x)", _samples(biases, sd=0.1)))
    assert "**-1.00**" in md and "<u>2.00</u>" in md and "**30.00**" in md
    # Noisy resamples: LIDAO and PPLM cannot be told apart; UDDIA is clearly worse.
    noisy = layout(cells, "a(x)", _samples(biases, sd=3.0)).blocks
    close = {r.method: r.fields[1].mark for r in noisy[0].rows}
    assert close["lidao-min"] == "nd" and close["pplm"] == "nd" and close["vanilla"] == ""
    assert "-1.00 (n.d.)" in markdown_table(layout(cells, "a(x)", _samples(biases, sd=3.0)))
    # The level decides: LIDAO vs PPLM gives p = 0.355 here, clear at 60% and not at 95%.
    for level, mark in ((0.95, "nd"), (0.6, "best")):
        lay = layout(cells, "a(x)", _samples(biases, sd=0.5), level=level)
        assert {r.method: r.fields[1].mark for r in lay.blocks[0].rows}["lidao-min"] == mark
    bare = layout(cells, "a(x)").blocks  # no resamples: no bias is marked
    assert {r.fields[1].mark for r in bare[0].rows} == {""}


def test_marks_compare_printed_values_and_skip_missing() -> None:
    assert _marks([1.0, 1.001, 2.0, None, 3.0]) == ["best", "best", "second", "", ""]
    assert _marks([None]) == [""]


def test_latex_rows_have_one_cell_per_column(report_run: Any) -> None:
    lay = layout(report_run.cells, "a(x)", report_run.samples)
    tex = latex_table(lay, "caption", "tab:x")
    assert tex.count("{") == tex.count("}")
    rows = [line for line in tex.splitlines() if line.startswith(("GPT-2", "+", "tiny"))]
    assert len(rows) == 6
    # Score, bias, PPL per task, and the count-matched EMT / bias-corrected TV beside theirs.
    assert [c.header for c in lay.columns if c.task != "sentiment"] == [
        "NNRe", "Bias", "Bias bc", "PPL", "Toxi", "Bias", "Bias cm", "PPL"
    ]  # fmt: skip
    assert all(line.count("&") == len(lay.columns) for line in rows)
    assert r"\textbf{" in tex and r"\underline{" in tex and r"tiny-random/gpt2" in tex


def test_count_matched_column_is_marked_from_its_own_resamples(report_run: Any) -> None:
    def cm_marks(lay: Any) -> set[str]:
        at = next(i for i, c in enumerate(lay.columns) if c.stat == "bias_cm")
        return {r.fields[at].mark for b in lay.blocks for r in b.rows if r.method != "vanilla"}

    # Two debiasing methods per model: one is best (the other unmarked), or both are n.d.
    marked = cm_marks(
        layout(report_run.cells, "a(x)", report_run.samples, samples_cm=report_run.samples_cm)
    )
    assert marked & {"best", "nd"} and marked <= {"best", "nd", ""}
    assert cm_marks(layout(report_run.cells, "a(x)", report_run.samples)) == {
        ""
    }  # no resamples, no marks
    paired = paired_table(report_run.summary)
    assert set(paired.filter(pl.col("task") == "toxicity")["gap"]) == {"bias", "bias_cm"}
    assert set(paired["against"]) == {"vanilla", "uddia"}


def test_table_cells_pick_the_task_metric(report_run: Any) -> None:
    s = report_run.summary
    want = s.filter(
        (pl.col("model") == "gpt2-large") & (pl.col("method") == "uddia") & (pl.col("task") == "regard")
        & (pl.col("view") == "a(c,x)") & (pl.col("metric") == "regard") & (pl.col("group") == "labelled")
        & (pl.col("stat") == "nnre")
    )["value"][0]  # fmt: skip
    cell = table_cells(s).filter(
        (pl.col("model") == "gpt2-large") & (pl.col("method") == "uddia") & (pl.col("task") == "regard")
        & (pl.col("view") == "a(c,x)")
    )  # fmt: skip
    assert cell["score"][0] == want


# ---- the paper's numbers ---------------------------------------------------------------------


def test_paper_values_beside_ours(report_run: Any) -> None:
    paper = report_run.paper
    assert set(paper["model"].to_list()) == {"gpt2-large"}  # the tiny model matches no setting
    row = paper.filter(
        (pl.col("method") == "vanilla") & (pl.col("task") == "sentiment") & (pl.col("view") == "a(x)")
        & (pl.col("column") == "score")
    ).row(0, named=True)  # fmt: skip
    assert row["paper"] == 0.36 and row["paper_table"] == "tab:gen"
    assert row["diff"] == pytest.approx(row["ours"] - 0.36)
    ppl = paper.filter(pl.col("column") == "ppl")["note"]
    assert all("paper PPL by gpt2-xl" in n for n in ppl)  # our perplexity scorer is "v1"


def test_main_tables_win_over_the_appendix() -> None:
    from results.report.paper import compare_with_paper

    cells = cells_frame([("tiiuae/falcon-7b-instruct", "lidao-prod", 1.0, 20.0)]).with_columns(
        pl.lit("regard").alias("task")
    )
    got = compare_with_paper(cells, "perplexity:gpt2-xl@main")
    bias = got.filter(pl.col("column") == "bias").row(0, named=True)
    assert (bias["paper"], bias["paper_table"]) == (2.59, "tab:gen")  # appendix prints 2.32
    assert got.filter(pl.col("column") == "ppl")["note"][0] == ""
    large = compare_with_paper(cells, "perplexity:tiiuae/falcon-40b")
    assert large.filter(pl.col("column") == "ppl")["paper_table"][0] == "tab:app:gen:lpp"


def test_paper_table_shape() -> None:
    paper = load_paper_tables()
    counts = dict(paper.group_by("table").len().iter_rows())
    # Table 1: GPT-2 7 rows (GeDi, DExperts without regard), OPT and Falcon 5 rows; 3 tasks.
    assert counts == {
        "tab:gen": 49,
        "tab:joint": 49,
        "tab:app:gen": 45,
        "tab:app:joint": 45,
        "tab:app:gen:lpp": 42,
        "tab:app:joint:lpp": 42,
    }
    assert (
        paper.filter(pl.col("table") == "tab:gen")
        .select("model", "method", "task")
        .is_duplicated()
        .sum()
        == 0
    )


def test_paper_numbers_appear_in_the_latex_source() -> None:
    tex_path = SHARED / "docs" / "paper" / "lidao.tex"
    if not tex_path.is_file():
        pytest.skip(f"{tex_path} not present")
    tex = tex_path.read_text()
    envs = {
        m.group(2): m.group(1)
        for m in re.finditer(
            r"\\begin\{table\*\}(.*?\\label\{(tab:[^}]*)\}.*?)\\end\{table\*\}", tex, re.S
        )
    }
    for row in load_paper_tables().iter_rows(named=True):
        env = envs[row["table"]]
        assert f"{row['score']:.2f}$\\pm${row['score_sd']:.2f}" in env, row
        for col in ("bias", "ppl"):
            assert re.search(rf"(?<![\d.]){row[col]:.2f}(?!\d)", env), (row, col)

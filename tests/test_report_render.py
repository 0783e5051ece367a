"""The rendered report: LaTeX compiled by pdflatex and lualatex, pages and figures checked for
text that overlaps or leaves the page, on a run with awkward names and flagged cells."""

from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_run import write_rows
from text_boxes import overlaps

from results.report.build import aggregate_run
from results.report.plot import figure_files, forest_figure, pareto_front, tradeoff_figure
from results.report.tex import tex_escape

ODD_MODEL = "org/tiny_model&co%#1"  # a model id with TeX's specials in it
TEXT = '{"tau": 0.5} p < 0.05 |bias| ≈ −1.5 ± 2 × 3 R&D 50% #1 $5 a_b é --ppl-max'


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not on PATH (bash scripts/setup.sh --dev installs it)")
    return path


@pytest.fixture(scope="module")
def awkward(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Three tasks, two models (one with specials in its id), a method in two variants
    (JSON params), 3 pairs (few units everywhere), a toxicity scorer that failed on most
    female rows of one cell; aggregated at level 0.9."""
    rng = np.random.default_rng(3)
    rows = []
    methods = [
        ("vanilla", {}),
        ("uddia", {}),
        ("lidao-min", {"tau": 0.5}),
        ("lidao-min", {"tau": 1.0}),
    ]
    for model, (method, params), task in itertools.product(
        ("gpt2-large", ODD_MODEL), methods, ("sentiment", "regard", "toxicity")
    ):
        for p, s in itertools.product(range(6), range(3)):
            group = ("female", "male")[p % 2]
            failed = model == ODD_MODEL and method == "uddia" and group == "female" and s < 2
            rows.append(
                {
                    "job_id": f"{model}|{method}|{params}|{task}|{p}|{s}",
                    "model": model, "method": method, "task": task, "seed": s,
                    "method_params": json.dumps(params), "prompt_group": group,
                    "prompt_id": f"{group}:{p:05d}", "pair_id": f"{p // 2:05d}",
                    "label_x": str(rng.choice(["female", "male"])), "label_cx": group,
                    "label_c": group, "sentiment": float(rng.uniform()),
                    "regard_label": str(rng.choice(["negative", "neutral", "positive"])),
                    "toxicity": None if failed else float(rng.beta(1, 4)),
                    "perplexity": float(rng.lognormal(3.3, 0.4)),
                }
            )  # fmt: skip
    # a run directory as deep as a CI checkout's (its path is the report's title): one
    # long path segment and many short ones, neither may overflow the page
    deep = tmp_path_factory.mktemp("awkward") / ("d" * 70) / "/".join(["pytest-of-root"] * 8)
    store = write_rows(str(deep / "run"), rows)
    return aggregate_run(store, n_boot=100, level=0.9)


def word_boxes(
    pdf: Path,
) -> list[tuple[float, float, list[tuple[float, float, float, float, str]]]]:
    """Per page (width, height, words (x0, y0, x1, y1, text)) from `pdftotext -bbox`, in the
    page's displayed orientation (a landscape page's width and height swapped)."""
    page_html = subprocess.run(
        [binary("pdftotext"), "-bbox", str(pdf), "-"], check=True, capture_output=True, text=True
    ).stdout
    info = subprocess.run(
        [binary("pdfinfo"), "-f", "1", "-l", "999", str(pdf)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rotated = [int(r) % 180 == 90 for r in re.findall(r"Page\s+\d+ rot:\s+(\d+)", info)]
    pages = []
    for i, (w, h, body) in enumerate(
        re.findall(r'<page width="([\d.]+)" height="([\d.]+)">(.*?)</page>', page_html, re.S)
    ):
        words = [
            (float(a), float(b), float(c), float(d), html.unescape(t))
            for a, b, c, d, t in re.findall(
                r'<word xMin="([-\d.]+)" yMin="([-\d.]+)" xMax="([-\d.]+)" yMax="([-\d.]+)">(.*?)</word>',
                body,
            )
        ]
        width, height = (float(h), float(w)) if rotated[i] else (float(w), float(h))
        pages.append((width, height, words))
    return pages


def test_tex_escape_prints_the_same_text_in_both_engines(tmp_path: Path) -> None:
    for engine in ("pdflatex", "lualatex"):
        doc = tmp_path / engine / "e.tex"
        doc.parent.mkdir()
        body = tex_escape(TEXT)
        doc.write_text(
            "\\documentclass{article}\\pagestyle{empty}\\begin{document}\\noindent "
            + body
            + "\n\\end{document}\n"
        )
        res = subprocess.run(
            [binary(engine), "-interaction=nonstopmode", "-halt-on-error", doc.name],
            cwd=doc.parent, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert res.returncode == 0, res.stdout[-2000:]
        text = subprocess.run(
            [binary("pdftotext"), "-enc", "UTF-8", str(doc.with_suffix(".pdf")), "-"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        # OT1's \_ is a rule, not a glyph: pdflatex's text has a space where the "_" is drawn.
        want = TEXT if engine == "lualatex" else TEXT.replace("a_b", "a b")
        assert unicodedata.normalize("NFC", " ".join(text.split())) == want, engine


def test_report_compiles_with_pdflatex_and_lualatex_and_no_text_overlaps(
    awkward: Any, tmp_path: Path
) -> None:
    report = Path(awkward.paths["report.tex"]).parent
    tex = (report / "tables.tex").read_text()
    assert tex.count(r"\label{tab:harness:") == 4 and r"\begin{landscape}" in tex
    assert r"\toprule" in tex and r"\textsuperscript{\dag}" in tex  # 3 pairs: few units
    for engine in ("pdflatex", "lualatex"):
        work = tmp_path / engine
        shutil.copytree(report, work)
        for _ in range(2):  # twice: the \ref's to the tables' \label's resolve
            res = subprocess.run(
                [binary(engine), "-interaction=nonstopmode", "-halt-on-error", "report.tex"],
                cwd=work, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert res.returncode == 0, (engine, res.stdout[-3000:])
        log = (work / "report.log").read_text(errors="replace")
        assert not re.findall(r"^! .*", log, re.M), engine
        assert "Overfull \\hbox" not in log and "Float too large" not in log, engine
        assert "undefined" not in log.lower(), engine  # references, characters
        pdf = work / "report.pdf"
        pages = word_boxes(pdf)
        text = " ".join(w[4] for _, _, words in pages for w in words)
        odd = ODD_MODEL if engine == "lualatex" else ODD_MODEL.replace("_", " ")  # OT1's \_
        for want in (odd, "+LIDAO-m [tau=0.5]", "+LIDAO-m [tau=1.0]", "|bias|", "(p < 0.1)"):
            assert want in text, (engine, want)
        assert "Bias cm" in text and "Bias bc" in text and "n.d." in text
        assert "[U+" not in text  # every character the report prints has its command
        assert "Warnings of Table 1." in text and "female 6/9 (6 failed)" in text
        for n, (width, height, words) in enumerate(pages, 1):
            outside = [w for w in words if w[0] < 0 or w[1] < 0 or w[2] > width or w[3] > height]
            assert outside == [], (engine, n, outside[:5])
            assert overlaps(words, core=0.3) == [], (engine, n)
        # A screenshot of every page: landscape pages for the three-task tables, none blank.
        subprocess.run(
            [binary("pdftoppm"), "-r", "30", "-png", str(pdf), str(work / "page")], check=True
        )
        from PIL import Image

        shots = sorted(work.glob("page-*.png"))
        assert len(shots) == len(pages)
        sizes = [Image.open(s).size for s in shots]
        assert sum(w > h for w, h in sizes) >= 4, sizes  # one landscape page per view at least
        for shot in shots:
            grey = np.asarray(Image.open(shot).convert("L"))
            assert (grey < 250).mean() > 0.005, shot.name  # ink on every page


def test_the_level_reaches_every_title_and_mark(awkward: Any) -> None:
    report = Path(awkward.paths["tables.md"]).parent
    md = (report / "tables.md").read_text()
    assert md.count("level 90%)") == 5  # four views and the paired comparisons
    tex = (report / "tables.tex").read_text()
    assert tex.count("(level 90\\%)") == 4 and "at level 90\\% (p \\textless{} 0.1)" in tex
    page = (report / "index.html").read_text()
    assert page.count("(level 90%)") == 5 and "90% interval" in page
    for text in (md, tex, page):
        assert not re.search(r"95\\?%|(<|textless\{\}) 0\.05", text)  # none left
    assert Path(awkward.paths["tradeoff.svg"]).read_text().count("90% bootstrap interval") == 1
    # Failed scores and few pairs: in the notes, flagged in the cells, counted under the table.
    notes = md[md.index("## Notes") : md.index("## Table 1")]
    assert "‡ missing or failed scores" in notes and "† gaps on fewer than 20" in notes
    for text in (md, page):
        assert "female 6/9 (6 failed), male 0/9" in text and "n.d." in text and "p=" in text


def text_boxes(fig: Any) -> list[tuple[float, float, float, float, str]]:
    """Window extents of every visible, non-empty text of a drawn figure (tick labels, titles,
    axis labels, legend entries), as (x0, y0, x1, y1, text)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hidden = set()  # labels of ticks outside the view limits: kept by matplotlib, never drawn
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            slack = 1e-9 * max(1.0, abs(hi - lo))
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - slack <= tick.get_loc() <= hi + slack:
                    hidden |= {id(tick.label1), id(tick.label2)}
    boxes = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and id(t) not in hidden:
            e = t.get_window_extent(renderer)
            if e.width > 0 and e.height > 0:
                boxes.append((e.x0, e.y0, e.x1, e.y1, t.get_text()))
    return boxes


def test_figures_have_no_overlapping_text_and_come_in_three_formats(awkward: Any) -> None:
    touching = [(0.0, 0.0, 10.0, 10.0, "a"), (10.0, 0.0, 20.0, 10.0, "b")]
    assert overlaps(touching, 0.0) == [] and overlaps([*touching, (5, 5, 9, 20, "c")], 0.0) == [
        ("a", "c")
    ]
    cells, level = awkward.cells, awkward.level
    figures = {
        "forest": forest_figure(cells, level),
        "tradeoff": tradeoff_figure(cells, "a(x)", level),
    }
    for name, fig in figures.items():
        boxes = text_boxes(fig)
        assert len(boxes) > 20, name
        grown = [(b[0] - 1, b[1] - 1, b[2] + 1, b[3] + 1, b[4]) for b in boxes]
        assert overlaps(grown, core=0.0) == [], name  # not even touching (1 px apart)
        width, height = fig.canvas.get_width_height()
        assert all(0 <= b[0] and b[2] <= width and 0 <= b[1] and b[3] <= height for b in boxes), (
            name
        )
        texts = [b[4] for b in boxes]
        assert any("90% bootstrap interval" in t for t in texts), name  # the level in the title
        assert "vanilla" in texts, name
        assert "+LIDAO-m [tau=0.5]" in texts, name  # the tables' names
    # The written files: PNG, PDF and SVG, the same bytes from the same cells (no dates, no
    # random ids), laid out once.
    again = figure_files(tradeoff_figure(cells, "a(x)", level))
    for fmt, magic in (("png", b"\x89PNG"), ("pdf", b"%PDF"), ("svg", b"<?xml")):
        assert again[fmt].startswith(magic), fmt
        assert Path(awkward.paths[f"tradeoff.{fmt}"]).read_bytes() == again[fmt], fmt
        for name in ("forest", "tradeoff_acx"):
            assert Path(awkward.paths[f"{name}.{fmt}"]).stat().st_size > 5000, (name, fmt)


def test_the_front_is_computed_on_the_plotted_size() -> None:
    # |bias| is plotted: a large negative gap is far from the best, not below it.
    import polars as pl

    cells = pl.DataFrame(
        [
            {"model": "gpt2-large", "method": m, "variant": "", "task": "sentiment", "view": "a(x)",
             "bias": b, "ppl": p}
            for m, b, p in (("vanilla", 1.0, 30.0), ("uddia", -20.0, 26.0), ("lidao-min", 2.0, 25.0))
        ]
    )  # fmt: skip
    fig = tradeoff_figure(cells, "a(x)")
    ax = fig.axes[0]
    ringed = ax.collections[-1].get_offsets()
    assert sorted(map(tuple, np.asarray(ringed).tolist())) == [(25.0, 2.0), (30.0, 1.0)]
    assert pareto_front([(30.0, 1.0), (26.0, -20.0), (25.0, 2.0)]) == [2, 1]  # signed: wrong


def test_a_narrow_figure_wraps_its_legend_inside_the_page() -> None:
    # One panel and five methods: a single row of legend entries is wider than the figure and
    # would be clipped at both edges (vanilla's marker, the last name's end).
    import polars as pl

    methods = ("vanilla", "uddia", "lidao-min", "lidao-prod", "elidao-min")
    cells = pl.DataFrame(
        [
            {"model": "gpt2-large", "method": m, "variant": "", "task": "sentiment",
             "view": "a(x)", "bias": float(3 * i - 5), "ppl": 20.0 + i}
            for i, m in enumerate(methods)
        ]
    )  # fmt: skip
    fig = tradeoff_figure(cells, "a(x)")
    fig.canvas.draw()
    (legend,) = fig.legends
    box = legend.get_window_extent(fig.canvas.get_renderer())
    width, height = fig.canvas.get_width_height()
    assert 0 <= box.x0 and box.x1 <= width and 0 <= box.y0, (box, width)
    assert len(legend.get_texts()) >= len(methods)  # and the Pareto front
    boxes = text_boxes(fig)
    assert overlaps([(b[0] - 1, b[1] - 1, b[2] + 1, b[3] + 1, b[4]) for b in boxes], 0.0) == []


def test_code_spans_of_the_prose_are_typeset_not_printed_with_backticks(awkward: Any) -> None:
    # The legends and notes are written once, markdown-style (`other`, `none`): tables.md keeps
    # the spans, LaTeX and HTML typeset them instead of printing the backticks.
    report = Path(awkward.paths["tables.md"]).parent
    assert "share of `other`" in (report / "tables.md").read_text()
    tex = (report / "tables.tex").read_text() + (report / "report.tex").read_text()
    assert r"share of \texttt{other}" in tex and r"\textasciigrave" not in tex
    page = (report / "index.html").read_text()
    assert "share of <code>other</code>" in page and "<code>none</code>" in page
    assert "`" not in re.sub(r"<pre>.*?</pre>", "", page, flags=re.S)

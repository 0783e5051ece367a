"""Reports: aggregate_run outputs, paper-style tables, the paper's numbers, plot, HTML, compare."""

from __future__ import annotations

import argparse
import base64
import fcntl
import io
import json
import os
import re
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from fake_run import synthetic_run
from test_report_render import overlaps

from harness.cli.compare import add_compare_args, compare_main
from results.report.build import aggregate_run, markdown_table
from results.report.cells import paired_table, table_cells
from results.report.paper import load_paper_tables
from results.report.pieces import with_pieces
from results.report.plot import pareto_front, tradeoff_png
from results.report.tables import _marks, layout
from results.report.tex import latex_table
from workers.tiny import report_tokenizer, tiny_vocab

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("report") / "run"
    store = synthetic_run(str(root), models=("gpt2-large", "tiny-random/gpt2"))
    return aggregate_run(store, n_boot=200, tokenizer_for=report_tokenizer)  # as the driver does


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


def test_aggregate_run_writes_every_output(run: Any) -> None:
    figures = {
        f"{n}.{fmt}"
        for n in ("forest", "tradeoff", "tradeoff_acx")
        for fmt in ("png", "pdf", "svg")
    }
    assert set(run.paths) == {
        "summary.parquet", "summary.csv", "tables.md", "tables.tex", "report.tex", "index.html",
    } | figures  # fmt: skip
    assert pl.read_parquet(run.paths["summary.parquet"]).equals(run.summary)
    assert pl.read_csv(run.paths["summary.csv"]).height == run.summary.height
    md = Path(run.paths["tables.md"]).read_text()
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


def test_latex_rows_have_one_cell_per_column(run: Any) -> None:
    lay = layout(run.cells, "a(x)", run.samples)
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


def test_count_matched_column_is_marked_from_its_own_resamples(run: Any) -> None:
    def cm_marks(lay: Any) -> set[str]:
        at = next(i for i, c in enumerate(lay.columns) if c.stat == "bias_cm")
        return {r.fields[at].mark for b in lay.blocks for r in b.rows if r.method != "vanilla"}

    # Two debiasing methods per model: one is best (the other unmarked), or both are n.d.
    marked = cm_marks(layout(run.cells, "a(x)", run.samples, samples_cm=run.samples_cm))
    assert marked & {"best", "nd"} and marked <= {"best", "nd", ""}
    assert cm_marks(layout(run.cells, "a(x)", run.samples)) == {""}  # no resamples, no marks
    paired = paired_table(run.summary)
    assert set(paired.filter(pl.col("task") == "toxicity")["gap"]) == {"bias", "bias_cm"}
    assert set(paired["against"]) == {"vanilla", "uddia"}


def test_table_cells_pick_the_task_metric(run: Any) -> None:
    s = run.summary
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


def test_paper_values_beside_ours(run: Any) -> None:
    paper = run.paper
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


# ---- plot and HTML -----------------------------------------------------------------------


def test_pareto_front_keeps_undominated_points() -> None:
    points = [(20.0, 5.0), (30.0, 1.0), (25.0, 6.0), (40.0, 1.0), (10.0, 9.0)]
    assert pareto_front(points) == [4, 0, 1]


def test_tradeoff_png_is_valid_and_not_blank(run: Any) -> None:
    from PIL import Image

    data = Path(run.paths["tradeoff.png"]).read_bytes()
    assert data == tradeoff_png(run.cells, "a(x)")  # deterministic
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and image.width > 800 and image.height > 500
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 100  # text, markers, error bars: far from a blank canvas


def test_html_is_self_contained_with_tables_plot_and_coloured_tokens(run: Any) -> None:
    page = Path(run.paths["index.html"]).read_text()
    assert page.count('<table class="paper">') == 4  # a(x), a(c,x), a(c), file
    assert page.count("data:image/png;base64,") == 3  # forest + two trade-off plots
    assert 'alt="forest plot of the biases"' in page
    assert not re.search(r"""(src|href)=["'](?!data:)""", page)  # nothing fetched from elsewhere
    coloured = len(re.findall(r'class="tok-[ga]"', page)) - 2  # minus the legend
    # lidao-min rows carry 8 choices each; 3 samples per model × task.
    assert coloured == 2 * 3 * 3 * 8
    # The tiny model's tokens were stored as single-id decodes ("woman"): the page spaces
    # them as the tokenizer does (" woman"), from growing-prefix decodes.
    tiny = page[page.index("tiny-random/gpt2 · lidao-min") :]
    assert re.search(r'<span class="tok-[ga]"> (woman|said|that|he|was|kind|and|she|smiled)<', tiny)
    assert "harness</dt>" in page and "aggregated</dt>" in page and "config.yaml" in page
    assert "other " in page  # the share of `other` regard beside NNRe


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (no port opened)."""

    def __init__(self, binary: str, profile: Path) -> None:
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        # Move the child's ends above 10 so dup2 onto 3 / 4 cannot clobber one of them.
        high_r, high_w = (
            fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10),
            fcntl.fcntl(res_w, fcntl.F_DUPFD, 10),
        )

        def wire() -> None:
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--disable-extensions", "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            pass_fds=(3, 4),
            preexec_fn=wire,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in (cmd_r, res_w, high_r, high_w):
            os.close(fd)
        self.out, self.inp, self.buf, self.next_id = cmd_w, res_r, b"", 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            ready, _, _ = select.select([self.inp], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self.inp, 1 << 16)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return dict(json.loads(msg))

    def call(
        self, method: str, session: str | None = None, timeout: float = 30.0, **params: Any
    ) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def wait_for(self, event: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self._read(deadline))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.out)
        os.close(self.inp)


def test_html_renders_in_headless_chromium(run: Any, tmp_path: Path) -> None:
    binary = next(
        (b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
    )
    if binary is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium)")
    browser = Chromium(binary, tmp_path / "profile")
    try:
        target = browser.call("Target.createTarget", url="about:blank")["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable", session)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=1400,
            height=1000,
            deviceScaleFactor=1,
            mobile=False,
        )
        browser.call("Page.navigate", session, url=Path(run.paths["index.html"]).as_uri())
        browser.wait_for("Page.loadEventFired")
        check = "JSON.stringify({tables: document.querySelectorAll('table.paper').length, images: Array.from(document.images).map(i => i.complete && i.naturalWidth > 0), tokens: document.querySelectorAll('.tok-g, .tok-a').length, forest: Array.from(document.images).some(i => i.alt.startsWith('forest')), spaced: Array.from(document.querySelectorAll('.tok-g, .tok-a')).filter(e => e.textContent.startsWith(' ')).length})"
        state = json.loads(
            browser.call("Runtime.evaluate", session, expression=check)["result"]["value"]
        )
        layout_js = (
            "(() => { const out = []; const w = document.createTreeWalker(document.body, "
            "NodeFilter.SHOW_TEXT); let n; while ((n = w.nextNode())) { if (!n.textContent.trim()) "
            "continue; const r = document.createRange(); r.selectNodeContents(n); "
            "for (const b of r.getClientRects()) if (b.width > 0 && b.height > 0) out.push([b.left "
            "+ scrollX, b.top + scrollY, b.right + scrollX, b.bottom + scrollY, "
            "n.textContent.slice(0, 40)]); } return JSON.stringify({boxes: out, width: "
            "document.documentElement.scrollWidth, view: innerWidth}); })()"
        )
        placed = json.loads(
            browser.call("Runtime.evaluate", session, expression=layout_js)["result"]["value"]
        )
        shot = browser.call(
            "Page.captureScreenshot", session, format="png", captureBeyondViewport=True
        )
    finally:
        browser.close()
    errors = [
        e for e in browser.events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]  # fmt: skip
    assert errors == []
    assert state["tables"] == 4 and state["images"] == [True, True, True] and state["tokens"] > 0
    assert state["forest"] and state["spaced"] > 0
    # The screenshot's text: every line box of every text node, none overlapping another,
    # and nothing wider than the window (wide tables scroll inside their own box).
    boxes = [tuple(b) for b in placed["boxes"]]
    assert len(boxes) > 500 and placed["width"] <= placed["view"], placed["width"]
    assert overlaps(boxes, core=0.2) == []
    png = base64.b64decode(shot["data"])
    (tmp_path / "index.png").write_bytes(png)
    if os.environ.get("LIDAO_SCREENSHOT"):  # to look at it: LIDAO_SCREENSHOT=/tmp/shot.png
        Path(os.environ["LIDAO_SCREENSHOT"]).write_bytes(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


# ---- compare -------------------------------------------------------------------------------


def compare(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_compare_args(parser)
    return compare_main(parser.parse_args(list(argv)))


def test_compare_a_run_with_itself_shows_zero_differences(
    run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(run.run, run.run, "--fail-above", "0") == 0
    out = capsys.readouterr().out
    assert "only in A: 0, only in B: 0" in out
    assert "+0.000" in out and "NO" not in out


def test_compare_reports_differences_and_fails_above_a_threshold(
    run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = synthetic_run(str(tmp_path / "other"), models=("gpt2-large",), seed=7)  # no summary yet
    code = compare(
        run.run,
        other.uri,
        "--metric",
        "sentiment",
        "--view",
        "a(x)",
        "--fail-above",
        "0.001",
        "--n-boot",
        "50",
    )
    out = capsys.readouterr()
    assert code == 1 and "aggregated in memory" in out.out and "--fail-above" in out.err
    assert "only in A: 18" in out.out  # the tiny model: 3 methods × 3 tasks × (mean, bias)
    assert not (tmp_path / "other" / "summary.parquet").exists()


def test_compare_a_missing_run_is_an_error(
    run: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compare(run.run, str(tmp_path / "nothing")) == 2
    assert "no generation rows" in capsys.readouterr().err


def test_sample_tokens_are_spaced_by_the_tokenizer_the_caller_passes() -> None:
    vocab = {w: i for i, w in enumerate(tiny_vocab())}
    words = ["The", "woman", "said"]

    def rows() -> list[dict[str, Any]]:  # single-id decodes, no continuation to align with
        ids = [vocab[w] for w in words]
        return [{"model": "tiny-random/gpt2", "tokens": words, "token_ids": ids}]

    assert with_pieces(rows(), report_tokenizer)[0]["pieces"] == ["The", " woman", " said"]

    def broken(model: str, revision: str | None) -> Any:
        raise OSError(f"no tokenizer for {model}")

    # No tokenizer (none found, or its loading failed): the stored tokens, aligned with the text.
    assert with_pieces(rows(), lambda m, r: None)[0]["pieces"] == words
    assert with_pieces(rows(), broken)[0]["pieces"] == words


def test_text_is_escaped_for_html_and_latex() -> None:
    from results.report.html import sample_html
    from results.report.tex import tex_escape

    row = {
        "model": "m",
        "method": "lidao-min",
        "task": "t",
        "prompt": "<p>",
        "tokens": ["<b>", " &"],
        "choices": ["g", "x"],
    }
    html = sample_html(row)
    assert '<span class="tok-g">&lt;b&gt;</span><span> &amp;</span>' in html and "<p>" not in html
    assert tex_escape("a_b 5% ± #1") == r"a\_b 5\% $\pm$ \#1"

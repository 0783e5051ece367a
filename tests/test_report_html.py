"""The report's figures and HTML page: the Pareto front and trade-off plot, the self-contained
page with coloured tokens spaced by the tokenizer, escaping for HTML and LaTeX, and the page
rendered in headless Chromium with no text box over another. `report_run` is in
tests/conftest.py."""

from __future__ import annotations

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

import pytest
from text_boxes import overlaps

from results.report.pieces import with_pieces
from results.report.plot import figure_files, pareto_front, tradeoff_figure
from workers.tiny import report_tokenizer, tiny_vocab

# ---- plot and HTML -----------------------------------------------------------------------


def test_pareto_front_keeps_undominated_points() -> None:
    points = [(20.0, 5.0), (30.0, 1.0), (25.0, 6.0), (40.0, 1.0), (10.0, 9.0)]
    assert pareto_front(points) == [4, 0, 1]


def test_tradeoff_png_is_valid_and_not_blank(report_run: Any) -> None:
    from PIL import Image

    data = Path(report_run.paths["tradeoff.png"]).read_bytes()
    assert data == figure_files(tradeoff_figure(report_run.cells, "a(x)"))["png"]  # deterministic
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG" and image.width > 800 and image.height > 500
    colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 100  # text, markers, error bars: far from a blank canvas


def test_html_is_self_contained_with_tables_plot_and_coloured_tokens(report_run: Any) -> None:
    page = Path(report_run.paths["index.html"]).read_text()
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


def test_html_renders_in_headless_chromium(report_run: Any, tmp_path: Path) -> None:
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
        browser.call("Page.navigate", session, url=Path(report_run.paths["index.html"]).as_uri())
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

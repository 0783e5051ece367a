"""The CLI's logging (issue 24): third-party debug lines only with -vv, Ray's start line kept
out by -q, the Perspective bar only on a terminal and its summary line once, and a run that
names its outputs and logs no third-party debug lines (`everyday_run`, tests/conftest.py)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from harness.cli.commands import main
from tests.cli_run import REPO

# ---- logging and bars ----------------------------------------------------------------------


def test_third_party_debug_lines_only_with_vv(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.progress import setup_logging

    def emitted(verbosity: int) -> str:
        added = setup_logging(verbosity, progress=False)
        try:
            logging.getLogger("matplotlib.font_manager").debug("findfont: noise")
            logging.getLogger("urllib3.connectionpool").info("GET noise")
            logging.getLogger("filelock").warning("a real warning")
            logging.getLogger("harness").debug("our debug line")
        finally:
            for key in added:
                os.environ.pop(key, None)
        return capsys.readouterr().err

    v = emitted(1)
    assert "our debug line" in v and "a real warning" in v
    assert "findfont" not in v and "GET noise" not in v
    vv = emitted(2)
    assert "findfont: noise" in vv and "GET noise" in vv
    q = emitted(-1)
    assert "our debug line" not in q and "a real warning" in q


def test_quiet_keeps_rays_start_line_out() -> None:
    """`-q` sets RAY_LOGGER_LEVEL before ray is imported: its "Started a local Ray instance"
    is an info line of the `ray` logger, which then prints warnings only."""
    import subprocess

    code = (
        "from harness.progress import setup_logging; setup_logging(-1); "
        "import logging, ray._private.ray_constants as c; "
        "from ray._private.ray_logging import setup_logger; "
        "setup_logger(c.LOGGER_LEVEL, c.LOGGER_FORMAT); "
        "print(logging.getLogger('ray').getEffectiveLevel())"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_LOGGER_LEVEL", None)
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.stdout.strip() == str(logging.WARNING), res.stderr[-2000:]


def test_perspective_bar_only_on_a_terminal_and_its_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import harness.progress as progress
    import workers.console as console
    from workers.scorers.base import ScorerContext
    from workers.scorers.perspective import PerspectiveToxicity

    monkeypatch.delenv("PERSPECTIVE_API_KEY", raising=False)
    rows = [{"job_id": f"j{i}", "continuation": f" text {i}", "prompt": "p"} for i in range(3)]

    def scorer() -> PerspectiveToxicity:
        return PerspectiveToxicity({"cache_only": True}, ScorerContext(cache_dir=str(tmp_path)))

    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    off = scorer()  # pytest's output is no terminal
    off.begin(3)
    off.score(rows)
    assert off._bar is None
    off.close()
    monkeypatch.setattr(console, "is_terminal", lambda: True)
    on = scorer()
    on.begin(3)
    assert on._bar is not None
    on.close()
    monkeypatch.setenv("TQDM_DISABLE", "1")  # --no-progress, inherited
    quiet = scorer()
    quiet.begin(3)
    assert quiet._bar is None
    quiet.close()
    capsys.readouterr()
    added = progress.setup_logging(0, progress=False)  # the CLI's logging: the line is logged
    try:
        s = scorer()
        s.score(rows)
        s.close()
    finally:
        for key in added:
            os.environ.pop(key, None)
    err = capsys.readouterr().err
    assert err.count("perspective: 3 rows: 0 cached") == 1, err


def test_run_names_its_outputs_and_logs_no_third_party_debug(
    everyday_run: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, stdout, stderr = everyday_run
    for rel in ("report/index.html", "report/tables.md", "summary.csv", "results.json"):
        assert f"({rel}): {out / rel}" in stdout, stdout
    assert f"figures: {out / 'report' / 'forest.png'}" in stdout
    own = ("harness", "workers", "jobs", "results", "__main__")
    for line in stderr.splitlines():
        if " DEBUG " in line:
            assert line.split(" DEBUG ", 1)[1].split(".")[0].split(":")[0] in own, line
    assert main(["status", str(out)]) == 0
    assert f"report (report/index.html): {out / 'report' / 'index.html'}" in capsys.readouterr().out

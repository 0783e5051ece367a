"""Command-line habits: list / validate without torch or Ray, overrides, --include, logging,
bad input refused before Ray starts, URL tokens kept out of every file and log."""

from __future__ import annotations

import functools
import http.server
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_config import tiny_config

from harness.cli.commands import main
from harness.cli.options import overrides
from harness.cli.parser import build_parser

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "examples" / "data"


def python(code: str, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
    )


def config(tmp_path: Path, **changes: object) -> Path:
    return tiny_config(tmp_path, **changes)


LIGHT = """
import sys
from harness.cli.commands import main
codes = [main(a) for a in ARGS]
print("codes", codes, "heavy", sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules))
"""


def test_list_and_validate_import_neither_torch_nor_ray(tmp_path: Path) -> None:
    args = [
        ["list", "methods"],
        ["list", "scorers"],
        ["list", "models"],
        ["validate", "examples/methods-tiny.yaml", "--limit", "1", "-q"],
    ]
    res = python(LIGHT.replace("ARGS", repr(args)))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "codes [0, 0, 0, 0] heavy []" in res.stdout, res.stdout[-2000:]
    # parameters with their declared kinds and defaults; counts per model × method × task
    assert "    scope: str = context, one of context, last" in res.stdout
    assert "sentiment-vader  (metric sentiment;" in res.stdout
    assert (
        "    lidao-min × sentiment: " in res.stdout
        and "0 problem(s); nothing was started" in res.stdout
    )


def test_a_bad_parameter_value_fails_before_ray_starts(tmp_path: Path) -> None:
    cfg = config(
        tmp_path, methods=[{"name": "lidao-min", "params": {"gamma": "high", "scope": "bogus"}}]
    )
    out = tmp_path / "run"
    code = f"import sys; from harness.cli.commands import main; rc = main(['run', {str(cfg)!r}, '--out', {str(out)!r}]); print('rc', rc, 'ray' in sys.modules)"
    res = python(code)
    assert "rc 2 False" in res.stdout, (res.stdout, res.stderr[-2000:])
    assert "methods.0: method 'lidao-min': parameter gamma = 'high': must be a number" in res.stderr
    assert "scope = 'bogus': must be one of context, last" in res.stderr
    assert not out.exists()


def test_validate_counts_the_plan_and_reports_missing_heads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "config.json").write_text(
        '{"model_type": "gpt2", "n_layer": 2, "n_embd": 8}'
    )
    cfg = config(
        tmp_path,
        models=[{"id": "tiny-random/gpt2", "name": "tiny"}, {"id": "./lm"}],
        methods=["vanilla", "uddia"],
        tasks=["sentiment", "toxicity"],
    )
    assert main(["validate", str(cfg), "--samples", "3"]) == 2  # the local model has no head
    out = capsys.readouterr().out
    assert "4 prompts × 3 samples = 12 jobs per model × method × task; 96 jobs in all" in out
    assert "model tiny [tiny-random/gpt2]: offline random weights" in out
    assert f"model {tmp_path / 'lm'}: local folder" in out
    assert out.count("uddia × toxicity: 12 jobs; head: MISSING") == 1
    assert "uddia × sentiment: 12 jobs; head: random (tiny model)" in out
    assert "2 problem(s); nothing was started" in out


def test_verbosity_and_include_after_the_subcommand() -> None:
    p = build_parser()
    assert p.parse_args(["list", "methods", "-v"]).verbose == 1
    assert p.parse_args(["-v", "list", "methods"]).verbose == 1
    assert p.parse_args(["status", "r", "-q"]).quiet == 1
    args = p.parse_args(
        ["validate", "c.yaml", "--include", "a", "--models", "x,y", "--models", "z"]
    )
    assert args.include == ["a"] and args.models == ["x,y", "z"] and "verbose" not in args
    assert overrides(args)["models"] == ["x", "y", "z"]


def test_batch_size_on_the_command_line_is_a_number_or_auto(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = build_parser()
    assert (
        overrides(p.parse_args(["run", "c.yaml", "--out", "r", "--batch-size", "64"]))["batch_size"]
        == 64
    )
    assert (
        overrides(p.parse_args(["run", "c.yaml", "--out", "r", "--batch-size", "auto"]))[
            "batch_size"
        ]
        == "auto"
    )
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["run", "c.yaml", "--out", "r", "--batch-size", "lots"])
    assert exc.value.code == 2
    assert "--batch-size: a whole number or 'auto', got 'lots'" in capsys.readouterr().err


INCLUDED = """
from workers.methods.registry import register_method
from workers.scorers.registry import register_scorer
register_method("plain-copy", "workers.methods.base:Vanilla", params={"depth": 2})
register_scorer("vader-copy", "workers.scorers.vader:VaderSentiment", "sentiment")
"""


def test_include_registers_methods_and_scorers(tmp_path: Path) -> None:
    (tmp_path / "my_methods.py").write_text(INCLUDED)
    cfg = config(
        tmp_path, methods=[{"name": "plain-copy", "params": {"depth": 3}}], scorers=["vader-copy"]
    )
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    code = f"from harness.cli.commands import main; print('rc', main(['validate', {str(cfg)!r}, '--include', 'my_methods']))"
    res = python(code, env=env)
    assert "rc 0" in res.stdout, res.stderr[-2000:]
    res = python(code.replace(", '--include', 'my_methods'", ""), env=env)
    assert "rc 2" in res.stdout and "unknown method 'plain-copy'" in res.stderr
    bad = config(tmp_path, methods=[{"name": "plain-copy", "params": {"depth": "deep"}}])
    res = python(code.replace(str(cfg), str(bad)), env=env)
    assert "rc 2" in res.stdout and "parameter depth = 'deep': must be a whole number" in res.stderr


BOOM = """
from workers.methods.base import Vanilla
from workers.methods.registry import register_method


class Boom(Vanilla):
    def next_logprobs(self, ctx):
        raise RuntimeError("boom at every step")


register_method("boom", "boom_methods:Boom")
"""


def test_run_exits_1_when_a_method_failed_every_one_of_its_jobs(tmp_path: Path) -> None:
    """A plugin method whose every job fails: the run completes what it can (vanilla's jobs,
    scores, the report) and then exits 1 naming the method and where its errors are."""
    (tmp_path / "boom_methods.py").write_text(BOOM)
    cfg = config(tmp_path, methods=["vanilla", "boom"], scorers=["gender"])
    out = tmp_path / "run"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    args = ["--include", "boom_methods", "run", str(cfg), "--out", str(out), "--no-ray"]
    res = python(f"from harness.cli.commands import main; print('rc', main({args!r}))", env=env)
    assert "rc 1" in res.stdout, res.stderr[-3000:]
    assert "sentiment: planned 4, done 4, failed 0" in res.stdout  # vanilla ran
    last = res.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: method boom: all 4 of its jobs failed; their errors: `python -m harness "
        f"samples {out} --status error --method boom`"
    )
    assert (out / "summary.parquet").is_file()


NAN_SCORER = """
from workers.scorers.base import Scorer
from workers.scorers.registry import register_scorer


class NanSentiment(Scorer):
    name = "nan-sentiment"
    metric = "sentiment"
    version = "nan-1"

    def score(self, rows):
        return [{**self.key(r), "sentiment": float("nan")} for r in rows]


register_scorer("nan-sentiment", "nan_scorer:NanSentiment", "sentiment")
"""


def test_score_exits_1_when_a_scorer_failed_every_row(
    everyday_run: tuple[Path, str, str], tmp_path: Path
) -> None:
    """A scorer whose every score is NaN (an error row each) exited 0 (campaign, issue 29)."""
    from tests.cli_run import copy_run

    run = copy_run(everyday_run, tmp_path)
    (tmp_path / "nan_scorer.py").write_text(NAN_SCORER)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    args = ["--include", "nan_scorer", "score", str(run), "--scorer", "nan-sentiment", "--no-ray"]
    res = python(f"from harness.cli.commands import main; print('rc', main({args!r}))", env=env)
    assert "rc 1" in res.stdout, res.stderr[-3000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: scorer nan-sentiment: all 4 rows it scored are errors; their messages: the "
        f"`error` column of {run}/scores/nan-sentiment/ (`python -m harness status {run}`)"
    )


def test_progress_off_a_terminal_writes_plain_lines(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from harness.progress import Progress

    caplog.set_level(logging.INFO, logger="harness")
    bar = Progress("generate", total=4)
    bar.update(2, ok=1)
    bar.update(2)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    assert "generate: 4/4 jobs, 1 failed" in caplog.text


def test_log_lines_are_redacted_and_go_above_the_bars(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.progress import setup_logging

    added = setup_logging(0, progress=False)
    try:
        assert (
            os.environ["TQDM_DISABLE"] == "1" and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        )
        logging.getLogger("harness").info("fetching %s", "https://h/x?token=sekrit-42&a=1")
    finally:
        for key in added:
            os.environ.pop(key, None)
    err = capsys.readouterr().err
    assert "https://h/x?token=<redacted>&a=1" in err and "sekrit" not in err


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # the test server's own request log
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """The example pairs over http on 127.0.0.1 (base URL)."""
    handler = functools.partial(Quiet, directory=str(PAIRS))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def test_a_url_token_never_reaches_a_file_or_a_log(
    tmp_path: Path, served: str, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = "sekrit-url-token-77"
    files = {g: f"{served}/pairs-{g}.jsonl?token={secret}" for g in ("female", "male")}
    cfg = config(
        tmp_path,
        dataset={"kind": "paired-jsonl", "files": files, "limit": 2},
        runtime={"cache_dir": str(tmp_path / "cache")},
    )
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                str(cfg),
                "--out",
                str(out),
                "--no-ray",
                "--no-progress",
                "--samples",
                "1",
                "-v",
            ]
        )
        == 0
    )
    logged = capfd.readouterr()
    assert secret not in logged.out + logged.err
    written = [p for p in (tmp_path / "run").rglob("*")] + list((tmp_path / "cache").rglob("*"))
    assert any(p.name.endswith(".parquet") for p in written)
    for p in written:
        assert secret not in p.name
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p
    snapshot = (out / "config.yaml").read_text()
    assert "token=<redacted>" in snapshot and "samples_per_prompt: 1" in snapshot


def test_the_readme_names_every_command_and_train_head_shows_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    readme = (REPO / "README.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    for name in sub.choices:  # type: ignore[union-attr]
        assert f"python -m harness {name}" in readme, name
    assert "lidao-harness" in readme
    with pytest.raises(SystemExit):
        main(["train-head", "--help"])
    shown = capsys.readouterr().out
    assert "default: 0.0001" in shown and "(default: train)" in shown and "None" not in shown


CONTROLS = "\x1b[2J\x1b]0;owned\x07 \x00 \u202eevil \x9b"


def test_control_characters_from_a_dataset_reach_no_terminal_raw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Prompts holding ESC sequences, BEL, NUL, U+202E and a C1 control: `validate` warns
    (their count, the file, the first line), the run generates from them as they are, and
    `samples` (text and JSONL), `status` and error lines show them escaped as \\uXXXX; JSONL
    still reads back as the same text."""
    import json as json_

    from harness.cli.commands import main

    rows = {
        g: [f"The {w} said", f"The {w} {CONTROLS} laughed"]
        for g, w in (("f", "woman"), ("m", "man"))
    }
    files = {}
    for group, texts in rows.items():
        path = tmp_path / f"{group}.jsonl"
        path.write_text("".join(json_.dumps({"prompt": {"text": t}}) + "\n" for t in texts))
        files[group] = str(path)
    cfg = config(
        tmp_path,
        name=f"odd{CONTROLS}name",
        dataset={"kind": "paired-jsonl", "files": files},
        methods=["vanilla"],
    )
    caplog.set_level(logging.WARNING, logger="harness")
    assert main(["validate", str(cfg)]) == 0
    warned = [r.getMessage() for r in caplog.records if "control characters" in r.getMessage()]
    assert warned[0] == (
        f"{files['f']}: 1 prompt(s) hold control characters (ESC, BEL, NUL, bidirectional "
        "overrides), the first on line 2; generated from as they are, shown escaped (\\uXXXX) "
        "on a terminal"
    )
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", str(cfg), "--out", str(out), "--no-ray", "--no-progress", "-q"]) == 0
    raw = ("\x1b", "\x07", "\x00", "\u202e", "\x9b")
    ran = capsys.readouterr().out  # its last lines name the config, as `validate` does
    assert "run odd\\u001b[2J" in ran and not [c for c in raw if c in ran]
    for args in (["samples", str(out), "--limit", "0"], ["status", str(out)]):
        assert main(args) == 0
        shown = capsys.readouterr().out
        assert not [c for c in raw if c in shown], args
    assert main(["samples", str(out), "--grep", "laughed"]) == 0
    assert "\\u001b[2J\\u001b]0;owned\\u0007 \\u0000 \\u202eevil \\u009b" in capsys.readouterr().out
    assert main(["samples", str(out), "--format", "jsonl", "--limit", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not [c for c in raw if c in "".join(lines)]
    assert sum(CONTROLS in json_.loads(line)["prompt"] for line in lines) == 2  # the same text
    assert main(["status", str(tmp_path / f"no{CONTROLS}run")]) == 2
    err = capsys.readouterr().err
    assert "\\u001b[2J" in err and not [c for c in raw if c in err]

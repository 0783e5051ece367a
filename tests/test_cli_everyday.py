"""The everyday loop of the CLI (issue 24): --version and the program name, `--set` on run /
validate, pairs and prompts in `validate`, report paths in run / status, plugin scorers in
status and list, logging without third-party noise or bars, `score --overwrite`, results.json
against its schema, W&B (offline) / TensorBoard tracking and the Hub export (a fake hub on
127.0.0.1)."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import struct
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from harness.cli.commands import main
from harness.cli.parser import build_parser
from harness.config import ConfigError, dump_config, load_config
from results.run.store import RunStore

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "examples" / "data"


def config(tmp_path: Path, **changes: object) -> Path:
    data: dict[str, object] = {
        "name": "everyday",
        "dataset": {
            "kind": "paired-jsonl",
            "files": {g: str(PAIRS / f"pairs-{g}.jsonl") for g in ("female", "male")},
            "limit": 2,
        },
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla", "lidao-min"],
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 3},
        "scorers": ["gender", "sentiment-vader"],
        **changes,
    }
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(data))
    return path


# ---- small things: version, program name, --limit help ------------------------------------


def test_version_program_name_and_limit_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    version = (REPO / "pyproject.toml").read_text().split('version = "')[1].split('"')[0]
    assert capsys.readouterr().out.startswith(f"lidao-harness {version}")
    help_text = build_parser().format_help()
    assert help_text.startswith("usage: lidao-harness ") and "export" in help_text
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    run_help = sub.choices["run"].format_help()  # type: ignore[index]
    assert "first N pairs" in " ".join(run_help.split()) and "--set KEY=VALUE" in run_help


# ---- --set ---------------------------------------------------------------------------------


def test_set_changes_any_field_and_names_the_key_when_wrong(tmp_path: Path) -> None:
    path = config(tmp_path)
    sets = [
        "models.0.dtype=bfloat16",
        "methods.1.params.gamma=0.25",  # `lidao-min` given by name only
        "generation.top_p=0.5",
        "tasks=[sentiment, regard]",
        "models.1.id=tiny-random/opt",  # one past the end appends an entry
        "dataset.files.male=data/pairs-male.jsonl",  # relative to the config's folder
    ]
    shutil.copytree(PAIRS, tmp_path / "data")
    cfg = load_config(path, {"set": sets})
    assert cfg.models[0].dtype == "bfloat16" and cfg.models[1].id == "tiny-random/opt"
    assert cfg.methods[1].params == {"gamma": 0.25} and cfg.generation.top_p == 0.5
    assert cfg.tasks == ["sentiment", "regard"]
    assert cfg.dataset.files is not None
    assert cfg.dataset.files["male"] == str(tmp_path / "data" / "pairs-male.jsonl")
    snapshot = yaml.safe_load(dump_config(cfg))  # what run writes to config.yaml
    assert snapshot["models"][0]["dtype"] == "bfloat16" and snapshot["generation"]["top_p"] == 0.5

    def refused(*items: str) -> str:
        with pytest.raises(ConfigError) as exc:
            load_config(path, {"set": list(items)})
        return str(exc.value)

    assert "models.0.dtype" in refused("models.0.dtype=bf17")  # pydantic names the field
    assert "--set models.0.dtype=bf17" in refused("models.0.dtype=bf17")
    assert "--set models.5.dtype: models has 1 entries" in refused("models.5.dtype=float16")
    assert "--set models.x: models is a list" in refused("models.x=1")
    no_field = refused("generation.max_new_tokens.x=1")
    assert "--set generation.max_new_tokens.x: generation.max_new_tokens is 3, not a" in no_field
    assert "expected KEY=VALUE" in refused("generation.top_p")
    assert "--set generation.top_p: the value is not valid YAML" in refused("generation.top_p=[")
    assert "generation.top_q" in refused("generation.top_q=0.5")  # unknown field, by name
    secret = refused("scorers.0.params.api_key=sekrit-77", "generation.top_q=1")
    assert "sekrit-77" not in secret and "api_key=<redacted>" in secret


def test_validate_takes_set_and_prints_pairs_and_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path)
    rc = main(["validate", str(path), "--limit", "3", "--set", "samples_per_prompt=2", "-q"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "dataset: 3 pairs × 2 groups = 6 prompts; limit 3 (--limit counts pairs)" in out
    assert "6 prompts × 2 samples = 12 jobs" in out
    assert main(["validate", str(path), "--set", "models.0.dtype=half"]) == 2
    assert "models.0.dtype" in capsys.readouterr().err


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


# ---- a small run shared by the tests below (in this process, no Ray) -----------------------


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(run dir, stdout, stderr) of `run --no-ray -v` over 2 pairs, vanilla, 1 sample (the
    last two set with --set)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    tmp = tmp_path_factory.mktemp("everyday")
    out = tmp / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    args = ["run", str(config(tmp)), "--out", str(out), "--no-ray", "--no-progress", "-v"]
    args += ["--set", "methods=[vanilla]", "--set", "samples_per_prompt=1"]
    with redirect_stdout(stdout), redirect_stderr(stderr):
        rc = main(args)
    assert rc == 0, stderr.getvalue()[-3000:]
    return out, stdout.getvalue(), stderr.getvalue()


def copy_run(ran: tuple[Path, str, str], tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(ran[0], dst)
    return dst


def test_run_names_its_outputs_and_logs_no_third_party_debug(
    ran: tuple[Path, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, stdout, stderr = ran
    for rel in ("report/index.html", "report/tables.md", "summary.csv", "results.json"):
        assert f"({rel}): {out / rel}" in stdout, stdout
    assert f"figures: {out / 'report' / 'forest.png'}" in stdout
    own = ("harness", "workers", "jobs", "results", "__main__")
    for line in stderr.splitlines():
        if " DEBUG " in line:
            assert line.split(" DEBUG ", 1)[1].split(".")[0].split(":")[0] in own, line
    assert main(["status", str(out)]) == 0
    assert f"report (report/index.html): {out / 'report' / 'index.html'}" in capsys.readouterr().out


def test_status_knows_a_scorer_this_process_has_not_registered(
    ran: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = copy_run(ran, tmp_path)
    store = RunStore(str(out))
    vader = store.read_scores("sentiment-vader", "sentiment").to_dicts()
    store.write_scores("sentiment-elsewhere", "sentiment", [dict(r, scorer="x") for r in vader])
    assert main(["status", str(out)]) == 0
    shown = capsys.readouterr().out
    assert f"sentiment-elsewhere: ok {len(vader)}; missing 0" in shown
    assert "unknown scorer" not in shown


INCLUDED = """
from workers.scorers.registry import register_scorer
register_scorer("vader-typed", "workers.scorers.vader:VaderSentiment", "sentiment",
                params={"threshold": 0.5, "labels": ["pos", "neg"], "model": None,
                        "tokenizer": None}, kinds={"tokenizer": "str?"})
"""


def test_list_scorers_shows_included_scorers_with_typed_parameters(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "typed_scorer.py").write_text(INCLUDED)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    res = subprocess.run(
        [sys.executable, "-m", "harness", "list", "scorers", "--include", "typed_scorer"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "vader-typed  (metric sentiment; workers.scorers.vader:VaderSentiment)" in res.stdout
    assert "    threshold: float = 0.5" in res.stdout
    assert '    labels: list = ["pos", "neg"]' in res.stdout
    assert "    model: any = null" in res.stdout  # no declared kind: any type, null by default
    assert "    tokenizer: str? = null" in res.stdout  # its declared kind
    assert "    batch_size: int = 16" in res.stdout  # a built-in's (perplexity)


# ---- score --overwrite ---------------------------------------------------------------------


def test_score_overwrite_replaces_scores_only_when_the_new_ones_are_written(
    ran: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.scorers.vader import VaderSentiment

    out = copy_run(ran, tmp_path)
    store = RunStore(str(out))
    before = store.read_scores("sentiment-vader", "sentiment").sort("job_id")
    files_before = sorted(p.name for p in (out / "scores" / "sentiment-vader").iterdir())
    args = ["score", str(out), "--scorer", "sentiment-vader", "--no-ray", "--overwrite", "-q"]

    def broken(self: Any, rows: Any) -> list[dict[str, Any]]:
        raise RuntimeError("scorer broke mid-way")

    monkeypatch.setattr(VaderSentiment, "score", broken)
    assert main(args) == 1  # a failed scoring: the old scores stay whole
    after_failure = RunStore(str(out)).read_scores("sentiment-vader", "sentiment").sort("job_id")
    assert after_failure.equals(before)
    assert sorted(p.name for p in (out / "scores" / "sentiment-vader").iterdir()) == files_before

    def constant(self: Any, rows: Any) -> list[dict[str, Any]]:
        return [dict(self.key(r), sentiment=0.125) for r in rows]

    monkeypatch.setattr(VaderSentiment, "score", constant)
    assert main(args) == 0
    after = RunStore(str(out)).read_scores("sentiment-vader", "sentiment").sort("job_id")
    assert after["job_id"].to_list() == before["job_id"].to_list()  # every row, once
    assert (after["sentiment"] == 0.125).all()
    assert not (out / "overwrite").exists()  # the staging folder is gone
    monkeypatch.undo()
    plain = ["score", str(out), "--scorer", "sentiment-vader", "--no-ray", "-q"]
    assert main(plain) == 0  # without --overwrite nothing is missing: nothing changes
    again = RunStore(str(out)).read_scores("sentiment-vader", "sentiment")
    assert (again["sentiment"] == 0.125).all()


# ---- results.json --------------------------------------------------------------------------


def test_results_json_validates_against_its_schema_and_holds_every_cell(
    ran: tuple[Path, str, str], tmp_path: Path
) -> None:
    import jsonschema

    from results.report.results_json import write_results_json

    out = copy_run(ran, tmp_path)
    schema = json.loads((REPO / "docs" / "results.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = json.loads((out / "results.json").read_text())
    jsonschema.validate(doc, schema)
    summary = pl.read_parquet(out / "summary.parquet")
    assert len(doc["results"]) == summary.height
    gaps = summary.filter(pl.col("p_value").is_not_null())
    assert gaps.height  # the gender gaps carry p-values
    cells = {
        (c["method"], c["metric"], c["stat"], c["group"], c["view"]): c for c in doc["results"]
    }
    for row in gaps.iter_rows(named=True):
        cell = cells[(row["method"], row["metric"], row["stat"], row["group"], row["view"])]
        assert cell["p_value"] == pytest.approx(row["p_value"])
        assert cell["ci_low"] == row["ci_low"] and cell["ci_high"] == row["ci_high"]
    assert doc["config"]["methods"] == [{"name": "vanilla", "params": {}}]  # --set, recorded
    assert doc["config"]["samples_per_prompt"] == 1
    assert doc["versions"]["packages"]["pyarrow"] and doc["versions"]["lidao_harness"]
    # a secret in an old snapshot never reaches results.json
    snap = yaml.safe_load((out / "config.yaml").read_text())
    snap["scorers"].append({"name": "perspective", "params": {"api_key": "sekrit-99"}})
    (out / "config.yaml").write_text(yaml.safe_dump(snap))
    write_results_json(RunStore(str(out)))
    text = (out / "results.json").read_text()
    assert "sekrit-99" not in text and "<redacted>" in text
    jsonschema.validate(json.loads(text), schema)
    doc["results"][0]["p_value"] = 2.0  # the schema does check
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


# ---- tracking ------------------------------------------------------------------------------


def tf_records(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file (length, crc, data, crc)."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        yield data[at + 12 : at + 12 + length]
        at += 12 + length + 4


def test_tensorboard_events_hold_the_summary_and_figures(
    ran: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tensorboardX", reason="the tensorboard extra (tensorboardX)")
    from tensorboardX.proto.event_pb2 import Event

    from harness.cli.tracking import summary_scalars

    out = copy_run(ran, tmp_path)
    logdir = tmp_path / "tb"
    assert main(["aggregate", str(out), "--tensorboard", str(logdir), "-q"]) == 0
    assert f"tensorboard: {logdir}" in capsys.readouterr().out
    (events,) = list(logdir.glob("events.out.tfevents.*"))
    scalars: dict[str, float] = {}
    images, texts = set(), set()
    for record in tf_records(events):
        event = Event.FromString(record)
        for v in event.summary.value:
            if v.HasField("image"):
                images.add(v.tag)
            elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "text":
                texts.add(v.tag)
            else:
                scalars[v.tag] = v.simple_value
    expected = summary_scalars(RunStore(str(out)))
    assert expected and set(scalars) == set(expected)
    for tag, value in expected.items():
        assert scalars[tag] == pytest.approx(value, rel=1e-6, abs=1e-6), tag  # float32 on disk
    assert images == {"report/forest"}
    assert any(t.startswith("config") for t in texts)


def test_wandb_offline_run_holds_the_summary_and_figures(
    ran: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb", reason="the wandb extra")
    from harness.cli.tracking import summary_scalars

    out = copy_run(ran, tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert main(["aggregate", str(out), "--wandb", "everyday-test", "-q"]) == 0
    (run_dir,) = list((tmp_path / "wandb").glob("offline-run-*"))
    (table,) = list(run_dir.glob("files/media/table/summary_*.table.json"))
    logged = json.loads(table.read_text())
    summary = pl.read_parquet(out / "summary.parquet")
    assert logged["columns"] == summary.columns and len(logged["data"]) == summary.height
    assert list(run_dir.glob("files/media/images/report/forest_*.png"))
    (record,) = list(run_dir.glob("run-*.wandb"))
    raw = record.read_bytes()
    for tag in summary_scalars(RunStore(str(out))):  # every scalar's name is in the run
        assert tag.encode() in raw, tag


def test_wandb_refusing_the_login_is_one_error_line_and_keeps_the_files(
    ran: tuple[Path, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without a key and off a terminal, wandb.init raises UsageError: that was a traceback.
    wandb = pytest.importorskip("wandb", reason="the wandb extra")

    def refuse(**kwargs: Any) -> None:
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    out = copy_run(ran, tmp_path)
    assert main(["aggregate", str(out), "--wandb", "proj", "-q"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: --wandb proj: W&B refused the run (No API key configured.")
    assert "WANDB_MODE=offline" in err and f"aggregate {out} --wandb proj" in err
    assert (out / "summary.parquet").exists() and (out / "results.json").exists()


def test_score_refuses_a_cluster_that_does_not_answer_before_ray_starts(
    ran: tuple[Path, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    out = copy_run(ran, tmp_path)
    before = sorted(p.name for p in (out / "scores").rglob("*"))
    assert main(["score", str(out), "--scorer", "gender", "--address", dead]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: runtime.ray_address: {dead}: no Ray cluster answers (")
    monkeypatch.setenv("RAY_ADDRESS", dead)
    assert main(["score", str(out), "--scorer", "gender", "--overwrite"]) == 2
    assert f"RAY_ADDRESS: {dead}: no Ray cluster answers" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "scores").rglob("*")) == before  # nothing touched


# ---- export to a (fake) Hub ----------------------------------------------------------------


class FakeHub(BaseHTTPRequestHandler):
    """The four calls `create_repo` + `create_commit` make, answered like the Hub: every file
    is a regular (inline, base64) upload."""

    repos: dict[str, dict[str, bytes]] = {}
    auth: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, obj: Any, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.auth.append(self.headers.get("Authorization", ""))
        host = f"http://{self.headers['Host']}"
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:3] == ["api", "repos", "create"]:
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}"
            self.repos.setdefault(repo, {})
            return self._json({"url": f"{host}/datasets/{repo}", "name": repo})
        if parts[:2] == ["api", "validate-yaml"]:
            return self._json({"errors": [], "warnings": []})
        if parts[:2] == ["api", "datasets"] and parts[4] == "preupload":
            files = json.loads(body)["files"]
            modes = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
            ]
            return self._json({"files": modes, "commitOid": "0" * 40})
        if parts[:2] == ["api", "datasets"] and parts[4] == "commit":
            repo = f"{parts[2]}/{parts[3]}"
            for line in body.splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    value = item["value"]
                    self.repos[repo][value["path"]] = base64.b64decode(value["content"])
            return self._json(
                {
                    "commitUrl": f"{host}/datasets/{repo}/commit/{'1' * 40}",
                    "commitOid": "1" * 40,
                    "pullRequestUrl": None,
                }
            )
        return self._json({"error": f"not faked: {self.path}"}, 404)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from huggingface_hub import constants

    FakeHub.repos, FakeHub.auth = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(constants, "ENDPOINT", url)  # what HF_ENDPOINT sets at import
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_tests")
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def test_export_uploads_the_parquet_tables_and_report_in_one_commit(
    ran: tuple[Path, str, str],
    tmp_path: Path,
    hub: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = copy_run(ran, tmp_path)
    (out / "cache").mkdir(exist_ok=True)
    (out / "cache" / "perspective-scores.sqlite").write_bytes(b"not exported")
    assert main(["export", str(out), "--hub", "someone/everyday-run"]) == 0
    shown = capsys.readouterr().out
    assert f"to {hub}/datasets/someone/everyday-run" in shown
    uploaded = FakeHub.repos["someone/everyday-run"]
    for rel in ("summary.parquet", "results.json", "config.yaml", "report/index.html"):
        assert uploaded[rel] == (out / rel).read_bytes(), rel
    for folder in ("generations", "scores/gender", "scores/sentiment-vader"):
        shards = sorted(str(p.relative_to(out)) for p in (out / folder).glob("*.parquet"))
        assert shards and all(uploaded[s] == (out / s).read_bytes() for s in shards), folder
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert set(uploaded) - on_disk == {"README.md"}
    left = on_disk - set(uploaded)
    assert "cache/perspective-scores.sqlite" in left and "history.jsonl" in left
    assert not any(k.startswith("cache/") or "history" in k for k in uploaded)
    assert b"# everyday" in uploaded["README.md"]
    assert not any(k.startswith("cache/") or "history" in k or "lock" in k for k in uploaded)
    assert FakeHub.auth and all(a == "Bearer hf_fake_token_for_tests" for a in FakeHub.auth)
    assert main(["export", str(tmp_path / "nothing"), "--hub", "someone/x"]) == 2


def test_a_missing_tracker_package_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    out = tmp_path / "run"
    args = ["run", str(config(tmp_path)), "--out", str(out), "--no-ray", "--wandb", "proj"]
    assert main(args) == 2
    assert "--wandb: the 'wandb' package is not installed; pip install" in capsys.readouterr().err
    assert not out.exists()


def test_the_readme_says_how_to_use_the_venv_and_shows_each_new_option() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "source .venv/bin/activate" in readme and ".venv/bin/python -m harness" in readme
    for shown in (
        "lidao-harness --version",
        "--set models.0.dtype=bfloat16",
        "--overwrite",
        "python -m harness export RUN_DIR --hub",
        "--wandb",
        "--tensorboard DIR",
        "results.json",
        "report/index.html",
    ):
        assert shown in readme, shown

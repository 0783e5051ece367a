"""Models on the Hugging Face hub and in its cache, as `validate`, `score` and the actors see
them: offline (the `offline_hub` fixture of tests/conftest.py: an empty HF_HOME and a hub on a
closed port) a cached model needs no network and an uncached one fails at once, named, without
hub retries; an answering hub (a fake one on 127.0.0.1) is asked for metadata only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.validate_helpers import write_config
from workers import hub

REPO = Path(__file__).resolve().parents[1]


def test_offline_score_perplexity_fails_at_once_naming_the_model(
    tmp_path: Path, offline_hub: str
) -> None:
    cfg = write_config(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(cfg.read_text())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "harness", "score", str(run), "--scorer", "perplexity"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took = time.perf_counter() - t0
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: scorer perplexity, parameter model: ")
    assert "openai-community/gpt2-xl is not in the Hugging Face cache" in lines[0]
    assert took < 30, f"{took:.1f}s: the hub was retried"  # transformers alone: ~49 s


def test_a_user_offline_setting_is_honoured_without_a_probe(
    monkeypatch: pytest.MonkeyPatch, offline_hub: str
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = hub.availability("org/model")
    assert found.problem is not None and "HF_HUB_OFFLINE is set" in found.problem
    assert hub._probed == {}  # nothing was asked of the network


def fake_snapshot(root: Path, repo: str, files: list[str]) -> Path:
    folder = root / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    snap = folder / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in files:
        (snap / name).write_text("{}")
    return snap


def test_cached_models_need_no_network_and_partial_ones_are_named(
    tmp_path: Path, offline_hub: str
) -> None:
    hf = tmp_path / "hf"
    fake_snapshot(hf, "org/full", ["config.json", "model.safetensors", "tokenizer.json"])
    fake_snapshot(hf, "org/half", ["config.json"])
    assert hub.availability("org/full") == hub.Availability("in the Hugging Face cache (offline)")
    assert hub.availability("org/full", kind="tokenizer").problem is None
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # the probe failed: offline from now on
    assert list(hub._probed) == [offline_hub]  # probed once
    shards = fake_snapshot(hf, "org/sharded", ["config.json", "a.safetensors"])
    (shards / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w1": "a.safetensors", "w2": "b.safetensors"}})
    )
    assert "(only partly: no weights)" in str(hub.availability("org/sharded").problem)
    (shards / "b.safetensors").write_text("")
    assert hub.availability("org/sharded").problem is None
    half = hub.availability("org/half")
    assert half.problem is not None and "(only partly: no weights)" in half.problem
    assert "does not answer" in str(hub.availability("org/other").problem)
    assert list(hub._probed) == [offline_hub]  # still the one probe


class FakeHub(BaseHTTPRequestHandler):
    """HEAD / answers; /api/models/<id> knows `org/exists`, refuses `org/gated`."""

    seen: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.seen.append("HEAD " + self.path)
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        self.seen.append("GET " + self.path)
        repo = self.path.removeprefix("/api/models/")
        if repo == "org/exists":
            body = json.dumps({"id": repo, "sha": "abc"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(403 if repo == "org/gated" else 404)
        self.send_header("X-Error-Code", "GatedRepo" if repo == "org/gated" else "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_an_answering_hub_is_asked_for_metadata_only(
    monkeypatch: pytest.MonkeyPatch, offline_hub: str
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeHub.seen = []
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert hub.availability("org/exists") == hub.Availability("hub, downloads when loaded")
        assert "not found on the hub" in str(hub.availability("org/missing").problem)
        assert "is gated" in str(hub.availability("org/gated").problem)
    finally:
        server.shutdown()
        server.server_close()
    assert FakeHub.seen == [
        "HEAD /",
        "GET /api/models/org/exists",
        "GET /api/models/org/missing",
        "GET /api/models/org/gated",
    ]  # one probe, then metadata; no file was fetched
    assert "HF_HUB_OFFLINE" not in os.environ


def test_an_actor_loading_an_uncached_model_offline_fails_at_once(
    offline_hub: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the loading happens (a generation or scorer actor): one error naming the
    parameter and the model, no hub retries (transformers alone retries for ~49 s)."""
    from workers.scorers.base import ScorerContext, ScorerError
    from workers.scorers.perplexity import Perplexity

    t0 = time.perf_counter()
    with pytest.raises(ScorerError) as exc:
        Perplexity({"model": "org/uncached"}, ScorerContext(device="cpu"))
    assert str(exc.value).startswith(
        "scorer 'perplexity', parameter model: model 'org/uncached': org/uncached is not in the "
        "Hugging Face cache"
    )
    assert "\n" not in str(exc.value) and "Retrying" not in caplog.text
    assert time.perf_counter() - t0 < 30


CACHED_LOAD = """
import sys, time, torch
from jobs.spec import ModelRef
from workers.models import load_lm
from workers.tiny import build_tiny_lm
model, tokenizer = build_tiny_lm("tiny-random/gpt2", torch.float32)
model.save_pretrained(SNAP)
tokenizer.save_pretrained(SNAP)
t0 = time.perf_counter()
lm = load_lm(ModelRef("org/tiny"), device="cpu")
print("loaded", lm.model.config.n_embd == model.config.n_embd, "took %.1f" % (time.perf_counter() - t0))
"""


def test_a_cached_model_loads_offline_without_hub_retries(tmp_path: Path, offline_hub: str) -> None:
    """transformers checks a cached model's files on the hub too, retrying for minutes when it
    does not answer (146 s measured); the probe puts the load in offline mode instead. In a
    fresh process: huggingface_hub reads HF_HOME and HF_ENDPOINT once, at import."""
    snap = fake_snapshot(tmp_path / "hf", "org/tiny", [])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", CACHED_LOAD.replace("SNAP", repr(str(snap)))],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "loaded True" in res.stdout, res.stderr[-3000:]
    assert "Retrying" not in res.stderr and time.perf_counter() - t0 < 60, res.stdout

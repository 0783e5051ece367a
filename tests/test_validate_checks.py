"""`validate` runs every check `run` would hit before its first generation; `run` and `score`
refuse on the same problems before anything starts. Servers on 127.0.0.1 only; unreachable URLs
are closed ports; the hub is a fake endpoint (HF_ENDPOINT) and an empty HF_HOME."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_perspective import FakePerspective
from tiny_config import tiny_config

from harness.cli import machine, preflight
from harness.cli.validate import validate
from harness.config import parse_config
from workers import hub

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "examples" / "data"


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cluster() -> Iterator[str]:
    """HOST:PORT of something listening on 127.0.0.1 (the check only connects)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty HF cache and a hub endpoint that refuses connections; the process-wide
    probe memo and offline switch are put back after the test."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # `go_offline` sets the first
        monkeypatch.setenv(name, "0")  # recorded, so the value before the test comes back
        monkeypatch.delenv(name)
    monkeypatch.setattr(hub, "_probed", {})
    monkeypatch.setattr(hub, "_offline_why", [])
    if "huggingface_hub.constants" in sys.modules:
        constants = sys.modules["huggingface_hub.constants"]
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)
    yield endpoint


def write_config(tmp_path: Path, **changes: Any) -> Path:
    runtime = {"device": "cpu", "cache_dir": str(tmp_path / "cache")}
    return tiny_config(tmp_path, **{"runtime": runtime, **changes})


def problems_of(lines: list[str]) -> list[str]:
    start = lines.index(next(line for line in lines if line.startswith("problems (")))
    return [line.strip() for line in lines[start + 1 : -1]]


BOTH = """
import sys, time
from harness.cli.commands import main
t0 = time.perf_counter()
codes = [main(["validate", CFG]), main(["run", CFG, "--out", OUT, "--no-progress"])]
heavy = sorted(m for m in ("torch", "transformers", "ray") if m in sys.modules)
print("codes", codes, "heavy", heavy, "took %.1f" % (time.perf_counter() - t0))
"""


def test_validate_lists_every_problem_and_run_refuses_before_starting(
    tmp_path: Path, offline_hub: str
) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    (tmp_path / "ghost_plugin.py").write_text(
        "from workers.methods.registry import register_method\n"
        "register_method('ghost', 'ghost_pkg.method:Ghost', params={})\n"
    )
    cfg = write_config(
        tmp_path,
        dataset={
            "kind": "paired-jsonl",
            "files": {"female": str(PAIRS / "pairs-female.jsonl"), "male": f"{dead}/male.jsonl"},
        },
        gender_words=f"{dead}/pairs.txt?token=sekrit-77",
        models=[{"id": "tiny-random/gpt2", "num_gpus": 64}, {"id": "org/not-cached"}],
        methods=["vanilla", "ghost"],
        scorers=["gender", "perspective", "perplexity"],
        runtime={"device": "cuda:64", "cache_dir": str(tmp_path / "cache")},
    )
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("PERSPECTIVE_API_KEY", "RAY_ADDRESS")}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{REPO}"
    env["LIDAO_HARNESS_INCLUDE"] = "ghost_plugin"
    code = BOTH.replace("CFG", repr(str(cfg))).replace("OUT", repr(str(out)))
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert "codes [2, 2] heavy []" in res.stdout, (res.stdout[-3000:], res.stderr[-3000:])
    report, refusal = res.stdout.split("\nproblems (", 1)[1], res.stderr
    expected = {
        "dataset.files.male: ": f"{dead}/male.jsonl: unreachable",
        "gender_words: ": "set gender_words to the local path, or put the file at",
        "models.1.id: ": "org/not-cached is not in the Hugging Face cache",
        "scorers.2.params.model (default): ": "openai-community/gpt2-xl is not in the",
        "PERSPECTIVE_API_KEY: ": "`python -m harness score RUN --scorer perspective`",
        "runtime.device: ": "cuda:64 asked",
        "models.0.num_gpus: ": "64 GPU(s) asked",
        "methods.1: ": "ghost: module 'ghost_pkg.method'",
    }
    for field, text in expected.items():
        for where, name in ((report, "validate"), (refusal, "run")):
            hits = [ln for ln in where.splitlines() if ln.strip().startswith(field)]
            assert len(hits) == 1 and text in hits[0], (name, field, where[-4000:])
    assert "8 problem(s); nothing was started" in report
    assert "8 problem(s); nothing was started" in refusal
    assert "sekrit-77" not in report + refusal  # a URL token never reaches the output
    assert "Retrying" not in report + refusal
    assert not out.exists()  # `run` wrote nothing: no run directory, no plan, no generations


def test_run_refuses_a_missing_key_before_generating(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, scorers=["gender", "perspective"])
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PERSPECTIVE_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(cfg), "--out", str(out), "--no-ray"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr[-2000:]
    assert "PERSPECTIVE_API_KEY: scorers.1 (perspective) needs an API key" in res.stderr
    assert not out.exists()  # no plan, no generations: nothing was written


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


def test_perspective_key_file_and_endpoint_name_their_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "key.txt"
    empty.write_text("\n")
    monkeypatch.delenv("PERSPECTIVE_API_KEY", raising=False)
    monkeypatch.delenv("PERSPECTIVE_API_ENDPOINT", raising=False)
    cfg = parse_config(
        {
            **json.loads(write_config(tmp_path).read_text()),
            "scorers": [
                {"name": "perspective", "params": {"api_key_file": str(empty)}},
                {"name": "perspective", "params": {"cache_only": True}},
            ],
        }
    )
    items = preflight.check_keys(cfg)
    assert items[0].field == "scorers.0.params.api_key_file" and "is empty" in str(items[0].problem)
    assert items[1].problem is None and items[1].where == "cache only (no key needed)"
    with FakePerspective(api_key="k") as server:
        monkeypatch.setenv("PERSPECTIVE_API_KEY", "k")
        monkeypatch.setenv("PERSPECTIVE_API_ENDPOINT", server.endpoint)
        cfg = parse_config(
            {**json.loads(write_config(tmp_path).read_text()), "scorers": ["perspective"]}
        )
        reachable = preflight.check_services(preflight.check_keys(cfg), preflight.probe_url)
    assert [i.problem for i in reachable] == [None, None]
    monkeypatch.setenv("PERSPECTIVE_API_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    dead = preflight.check_services(preflight.check_keys(cfg), preflight.probe_url)
    assert dead[1].field == "PERSPECTIVE_API_ENDPOINT" and "cache_only" in str(dead[1].problem)


def test_devices_are_checked_on_this_machine_only(tmp_path: Path) -> None:
    base = json.loads(write_config(tmp_path).read_text())
    cuda = parse_config({**base, "runtime": {"device": "cuda"}})
    attached = parse_config({**base, "runtime": {"device": "cuda", "ray_address": "10.0.0.1:6379"}})
    assert machine.is_local_run(attached) is False and machine.is_local_run(attached, False)
    on_cluster = machine.check_devices(attached, machine.is_local_run(attached))
    assert [(i.where, i.problem) for i in on_cluster] == [("on the cluster's nodes", None)]
    n, why = machine.local_gpus()
    item = machine.check_devices(cuda, local=True)[0]
    assert item.field == "runtime.device"
    if n == 0:
        assert item.problem == f"cuda asked, but {why}; set runtime.device: cpu (or --device cpu)"
    else:
        assert item.problem is None
    share = parse_config({**base, "scorers": [{"name": "gender", "num_gpus": 0.5}]})
    items = machine.check_devices(share, local=True)
    assert [i.field for i in items] == ["scorers.0.num_gpus"]
    assert (items[0].problem is None) == (n > 0)


def test_a_missing_local_file_and_output_under_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.commands import main

    cfg = parse_config(
        {**json.loads(write_config(tmp_path).read_text()), "gender_words": str(tmp_path / "no")}
    )
    (tmp_path / "f").write_text("")
    lines, problems = validate(cfg, "c.yaml", out=str(tmp_path / "f" / "run"))
    assert problems == 2, lines
    assert problems_of(lines) == [
        "gender_words: no such file",
        f"--out: {tmp_path / 'f'} is a file, not a folder",
    ]
    assert main(["validate", str(write_config(tmp_path)), "--out", str(tmp_path / "f")]) == 2
    assert f"  --out: {tmp_path / 'f'} exists and is not a folder" in capsys.readouterr().out
    assert machine.check_output(str(tmp_path / "new" / "run")).problem is None
    assert machine.check_output("mock:///bucket/run") == preflight.Item(
        "--out", "mock:///bucket/run", "writable"
    )  # a probe object written and deleted through pyarrow
    remote = machine.check_output("nosuch://bucket/run")
    assert str(remote.problem).startswith("nosuch://bucket/run: cannot write (")


def test_the_method_model_parameters_match_the_methods() -> None:
    from workers.methods.registry import load_method

    for name, params in preflight.METHOD_MODEL_PARAMS.items():
        assert load_method(name).needs.extra_models == params


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


def test_paths_the_nodes_read_are_left_to_an_attached_cluster(tmp_path: Path, cluster: str) -> None:
    """A local run refuses a missing head or model folder; on an attached cluster the actors
    read them on the nodes, so the driver not seeing them is no problem (prompts it reads
    itself still are)."""
    base = json.loads(write_config(tmp_path).read_text())
    data = {
        **base,
        "models": [{"id": str(tmp_path / "lm-on-the-nodes")}],
        "methods": [{"name": "uddia", "params": {"head": str(tmp_path / "head.safetensors")}}],
        "gender_words": str(tmp_path / "words.txt"),
    }
    local = validate(parse_config(data), "c.yaml")
    assert problems_of(local[0]) == [
        "gender_words: no such file",
        "methods.0.params.head: no such file",
        f"models.0.id: {tmp_path / 'lm-on-the-nodes'}: no such folder",
    ]
    attached = {**data, "runtime": {**data["runtime"], "ray_address": cluster}}
    lines, problems = validate(parse_config(attached), "c.yaml")
    assert problems_of(lines) == ["gender_words: no such file"]
    assert "    uddia × sentiment: ? jobs; head " in "\n".join(lines)
    assert "not seen here; the nodes read it" in "\n".join(lines)


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


def test_urls_are_probed_all_at_once_and_each_once(tmp_path: Path) -> None:
    """Three URLs, five fields: three probes in flight together (a barrier of three would
    break if they ran one after another), one line per URL naming every field that uses it."""
    barrier = threading.Barrier(3, timeout=20)
    asked: list[str] = []

    def probe(url: str) -> str | None:
        asked.append(url)
        barrier.wait()
        return None if url.endswith("ok.jsonl") else "unreachable (test)"

    specs = [
        ("dataset.files.female", "http://h/ok.jsonl"),
        ("dataset.files.male", "http://h/m.jsonl"),
        ("methods.1.params.head", "http://h/head.pt"),
        ("methods.2.params.head", "http://h/head.pt"),
    ]
    items = preflight.check_files(specs, str(tmp_path), probe)
    assert sorted(asked) == ["http://h/head.pt", "http://h/m.jsonl", "http://h/ok.jsonl"]
    assert [i.problem is None for i in items] == [True, False, False, False]
    from harness.cli.validate import _file_problems

    lines = _file_problems(items)
    assert len(lines) == 2 and lines[1].startswith(
        "methods.1.params.head, methods.2.params.head: http://h/head.pt: unreachable (test); "
        "without network, download it elsewhere and set them to the local path"
    )


def test_validate_prints_the_gpu_budget_it_will_ask_for(tmp_path: Path, cluster: str) -> None:
    """`runtime.gpus` is the run's total, split between the models: 4 over 2 models is 2
    replicas of each, 4 GPUs, never 8."""
    base = json.loads(write_config(tmp_path).read_text())
    data = {
        **base,
        "models": [{"id": "tiny-random/gpt2"}, {"id": "tiny-random/opt", "num_gpus": 1}],
        "runtime": {**base["runtime"], "device": None, "gpus": 4, "ray_address": cluster},
    }
    lines, _ = validate(parse_config(data), "c.yaml")
    (budget,) = [line.strip() for line in lines if "GPU budget" in line]
    assert budget.startswith("GPU budget: 4 GPU(s)"), budget
    assert "tiny-random/gpt2: 2 × 1 GPU" in budget and "tiny-random/opt: 2 × 1 GPU" in budget
    cpu = {**base, "runtime": {**base["runtime"], "device": "cpu"}}
    lines, _ = validate(parse_config(cpu), "c.yaml")
    assert "  GPU budget: none (every model runs on CPU replicas)" in lines


def test_address_names_the_cluster_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster: str
) -> None:
    """`--address` is `runtime.ray_address`: what only the nodes read is then left to them."""
    from harness.cli.commands import main

    cfg = write_config(tmp_path, models=[{"id": str(tmp_path / "lm-on-the-nodes")}])
    assert main(["validate", str(cfg)]) == 2
    assert "lm-on-the-nodes: no such folder" in capsys.readouterr().out
    assert main(["validate", str(cfg), "--address", cluster]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


def test_a_cluster_that_does_not_answer_is_named_before_ray_waits_on_it(
    tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ray.init` on an address nothing answers retries for minutes, printing only Ray's own
    warnings: `validate` (and so `run`) names the address and its source at once."""
    base = json.loads(write_config(tmp_path).read_text())
    dead = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", dead)
    lines, problems = validate(parse_config(base), "c.yaml")
    (line,) = [p for p in problems_of(lines) if p.startswith("RAY_ADDRESS: ")]
    assert line.startswith(f"RAY_ADDRESS: {dead}: no Ray cluster answers (")
    assert "unset RAY_ADDRESS for a local run" in line and problems == 1
    assert validate(parse_config(base), "c.yaml", use_ray=False)[1] == 0  # --no-ray: no Ray
    named = {**base, "runtime": {**base["runtime"], "ray_address": f"ray://{dead}"}}
    lines, _ = validate(parse_config(named), "c.yaml")  # the config's address wins
    assert [p.split(":")[0] for p in problems_of(lines)] == ["runtime.ray_address"]
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    lines, problems = validate(parse_config(base), "c.yaml")
    assert problems == 0 and f"  RAY_ADDRESS: {cluster} (reachable)" in lines
    monkeypatch.setenv("RAY_ADDRESS", "auto")  # Ray's address file: left to Ray
    assert not [line for line in validate(parse_config(base), "c.yaml")[0] if "auto" in line]

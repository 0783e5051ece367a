"""Shared fixtures: paths to ../shared, one local Ray for the whole session, an offline hub, the
runs the report and everyday CLI tests share (made once a session), and the tiny models of the
baseline tests (`lm`, `models`: a module that needs other models defines its own)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.real_models import gemma3_file, gemma3_lm, smollm2_file, smollm2_lm  # noqa: F401

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Without it Ray 2.60 rewrites 127.0.0.1 to the outward address and listens on every interface.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per process: on 2 cores, torch's thread pools spin against each other and
# against Ray's workers (5-10x slower tiny ops measured); subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
UDDIA = SHARED / "data" / "uddia-prompts"


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    return SHARED


def _start_local_ray(tmp: str) -> None:
    import ray

    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=tmp,
        runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}},
    )


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[str]:
    """The session's local Ray temp dir; whichever Ray is up at the end is shut down."""
    import ray

    tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")
    try:
        yield tmp
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ray_local(_ray_session: str) -> None:
    """One local Ray bound to 127.0.0.1 with a short temp dir, shared by the session, started
    again when a module with its own cluster shut it down (tests/test_cluster_gpus.py does)."""
    import ray

    if not ray.is_initialized():
        _start_local_ray(_ray_session)


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty HF cache and a hub endpoint that refuses connections; the process-wide
    probe memo and offline switch are put back after the test."""
    from tests.validate_helpers import closed_port
    from workers import hub

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


@pytest.fixture(scope="session")
def report_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A synthetic run over two models, aggregated as the driver does (the report tests)."""
    from fake_run import synthetic_run

    from results.report.build import aggregate_run
    from workers.tiny import report_tokenizer

    root = tmp_path_factory.mktemp("report") / "run"
    store = synthetic_run(str(root), models=("gpt2-large", "tiny-random/gpt2"))
    return aggregate_run(store, n_boot=200, tokenizer_for=report_tokenizer)  # as the driver does


@pytest.fixture(scope="session")
def everyday_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(run dir, stdout, stderr) of `run --no-ray -v` over 2 pairs, vanilla, 1 sample (the
    last two set with --set), in this process, no Ray: the everyday CLI tests read it, or change
    a copy of it (`tests.cli_run.copy_run`)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from harness.cli.commands import main
    from tests.cli_run import config

    tmp = tmp_path_factory.mktemp("everyday")
    out = tmp / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    args = ["run", str(config(tmp)), "--out", str(out), "--no-ray", "--no-progress", "-v"]
    args += ["--set", "methods=[vanilla]", "--set", "samples_per_prompt=1"]
    with redirect_stdout(stdout), redirect_stderr(stderr):
        rc = main(args)
    assert rc == 0, stderr.getvalue()[-3000:]
    return out, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def lm() -> Any:
    """The tiny GPT-2 (random weights, offline), loaded once per test module on the CPU."""
    from jobs.spec import ModelRef
    from workers.models import load_lm

    return load_lm(ModelRef("tiny-random/gpt2"), device="cpu")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The baselines' extra tiny models (experts, GeDi's class-conditional LM), saved once per
    test module: name → local path."""
    from tests.baseline_helpers import save_tiny_variants

    return save_tiny_variants(tmp_path_factory.mktemp("models"))


@pytest.fixture
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fake Perspective endpoint that takes the test module's `KEY`, set as the key the
    scorer reads (each module its own key, so its secret checks look for that one)."""
    from fake_perspective import FakePerspective

    key = request.module.KEY
    monkeypatch.setenv("PERSPECTIVE_API_KEY", key)
    monkeypatch.delenv("PERSPECTIVE_API_ENDPOINT", raising=False)
    with FakePerspective(api_key=key) as server:
        yield server

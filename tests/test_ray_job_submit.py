"""`ray job submit --working-dir . -- python -m harness run ...` against a head started with
`ray start` on 127.0.0.1: the documented cluster workflow, end to end, then a driver killed
mid-run (`ray job stop`) and the same command submitted again.

The head is a CPU-only one-node cluster (no GPUs: the CPU placement path) with its own temp
dir and free ports; it is stopped by PID at the end, never with `ray stop`. Its temp dir is the
default one of its environment (`RAY_TMPDIR`), so `ray.init()` with that environment and no
address would find it, as it finds a `ray start --head` on a machine: a local run must not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import yaml

from results.run.store import RunStore
from tests.cli_run import harness
from tests.ray_procs import (
    free_port,
    listening_addresses,
    loopback_only,
    process_tree,
    stop_processes,
)

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")
pytestmark = pytest.mark.slow


class Head:
    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="rj", dir="/tmp")
        self.tmp = f"{self.root}/ray"  # Ray's default temp dir under RAY_TMPDIR=root
        self.port, self.dashboard = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.dashboard}"
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # the job's `python`
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # else 127.0.0.1 is rewritten (footguns.md)
            "RAY_ADDRESS": self.url,
            "RAY_TMPDIR": self.root,
            # `ray job stop`: SIGTERM, then SIGKILL after this many seconds (Ray's default: 3,
            # too short on a loaded 2-core machine to see the driver's own clean-up finish)
            "RAY_JOB_STOP_WAIT_TIME_S": "60",
        }
        self.env.pop("PYTHONPATH", None)  # the job must import the project from its working dir

    def start(self) -> None:
        args = [
            RAY,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            f"--port={self.port}",
            f"--dashboard-port={self.dashboard}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--temp-dir={self.tmp}",
            "--num-cpus=4",
            "--disable-usage-stats",
        ]
        env = {k: v for k, v in self.env.items() if k != "RAY_ADDRESS"}
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]

    def pids(self) -> set[int]:
        return process_tree([self.tmp, f"127.0.0.1:{self.port}"])

    def ray(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [RAY, *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def submit(self, config: str, out: Path, wait: bool = True, exit_line: bool = False) -> str:
        """`ray job submit` of `harness run`; `exit_line`: through bash, which prints the
        driver's exit status (`driver-exit=N`) after it ends, even when the job is stopped."""
        sid = f"lidao-test-{uuid.uuid4().hex[:8]}"
        run = ["python", "-m", "harness", "run", config, "--out", str(out), "--no-progress"]
        if exit_line:
            script = f"trap 'echo bash-got-sigterm' TERM; {shlex.join(run)}; echo driver-exit=$?"
            run = ["bash", "-c", script]
        res = self.ray(
            "job",
            "submit",
            "--working-dir",
            ".",
            "--submission-id",
            sid,
            *([] if wait else ["--no-wait"]),
            "--",
            *run,
        )
        assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
        return sid

    def status(self, sid: str) -> str:
        from ray.job_submission import JobSubmissionClient

        return str(JobSubmissionClient(self.url).get_job_status(sid).value)

    def stop(self) -> None:
        stop_processes(self.pids())
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    h = Head()
    try:
        h.start()
        yield h
    finally:
        h.stop()


def test_quickstart_submitted_as_a_ray_job_fills_the_run_directory(
    head: Head, tmp_path: Path
) -> None:
    out = tmp_path / "qs"
    sid = head.submit("examples/tiny.yaml", out)
    assert head.status(sid) == "SUCCEEDED"
    store = RunStore(str(out))
    gens = store.read_generations()
    assert gens.height == 30 and (gens["status"] == "ok").all()
    assert store.read_scores("sentiment-vader", "sentiment").height == 30
    assert (out / "summary.parquet").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    (actor,) = manifest["generation"]["actors"]
    assert actor["jobs"] == 30 and actor["num_gpus"] == 0 and actor["device"] == "cpu"
    model = manifest["generation"]["models"]["tiny-random/gpt2"]
    assert model["batch_size"] == 8 and model["peak_bytes_per_seq"] is None  # auto, on CPU
    assert (
        0 < actor["utilisation"] <= 1
        and actor["tokens_per_busy_s"] > 0
        and actor["end"] == "released"
    )
    logs = head.ray("job", "logs", sid).stdout
    assert "Ray cluster at" in logs and "generate tiny-random/gpt2: 30/30 jobs finished" in logs
    assert "generate tiny-random/gpt2: batches of 8 jobs (runtime.batch_size: auto)" in logs
    addresses = listening_addresses(head.pids())
    assert addresses and loopback_only(addresses), sorted(addresses)


def test_a_driver_stopped_mid_run_resumes_with_the_same_command(head: Head, tmp_path: Path) -> None:
    cfg = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    cfg["dataset"]["files"] = {
        g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")
    }
    cfg.update(
        samples_per_prompt=12, scorers=["gender"], runtime={"batch_size": 2, "device": "cpu"}
    )
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    first = head.submit(str(config), out, wait=False, exit_line=True)
    deadline = time.time() + 180
    while time.time() < deadline and len(list((out / "generations").glob("part-*.parquet"))) < 3:
        time.sleep(0.2)
    assert head.ray("job", "stop", first).returncode == 0  # waits until the job has stopped
    assert head.status(first) == "STOPPED"
    done_before = len(list((out / "generations").glob("part-*.parquet")))
    assert 3 <= done_before < 60, "the stop must land mid-generation"
    # SIGTERM reads as an interruption, not a crash: Ray's own handler (set by ray.init) would
    # exit 15 with outcome "error" and no resume line
    logs = head.ray("job", "logs", first).stdout
    assert "driver-exit=143" in logs, logs[-3000:]
    assert re.search(r"interrupted after \d+ of 120 jobs; run the same command to resume", logs)
    record = json.loads((out / "history.jsonl").read_text().splitlines()[-1])
    assert record["outcome"] == "interrupted (SIGTERM)"

    second = head.submit(str(config), out)
    assert head.status(second) == "SUCCEEDED"
    plan = RunStore(str(out)).read_plan()
    rows = pl.concat([pl.read_parquet(p) for p in (out / "generations").glob("part-*.parquet")])
    assert rows.height == plan.height == 120 and sorted(rows["job_id"]) == sorted(plan["job_id"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["generation"]["pending_at_start"] < 120  # the second driver resumed


INCLUDED = """
from workers.scorers.base import Scorer
from workers.scorers.registry import register_scorer


class Length(Scorer):
    name = "sentiment-length"
    metric = "sentiment"
    num_cpus = 0.25

    @property
    def version(self):
        return "length-1"

    def score(self, rows):
        return [{**self.key(r), "sentiment": min(1.0, len(r["continuation"]) / 100)} for r in rows]


register_scorer("sentiment-length", "included_scorer:Length", "sentiment")
"""


def test_a_driver_in_a_shell_attaches_through_ray_address(head: Head, tmp_path: Path) -> None:
    """`RAY_ADDRESS=HOST:PORT python -m harness run ...` on a cluster node: attach, ship the code,
    and the `--include` module too (the cluster's workers see neither the driver's PYTHONPATH
    nor its environment)."""
    out = tmp_path / "attached"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "included_scorer.py").write_text(INCLUDED)
    cfg = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())
    cfg["dataset"]["files"] = {
        k: str(REPO / "examples" / v) for k, v in cfg["dataset"]["files"].items()
    }
    cfg["scorers"] = ["gender", "sentiment-length"]
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in head.env.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ADDRESS=f"127.0.0.1:{head.port}", PYTHONPATH=f"{REPO}:{plugins}")
    res = harness(
        "--include",
        "included_scorer",
        "run",
        str(tmp_path / "cfg.yaml"),
        "--out",
        str(out),
        "--no-progress",
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"Ray cluster at 127.0.0.1:{head.port}: 1 node(s)" in res.stderr
    store = RunStore(str(out))
    gens = store.read_generations()
    assert gens.height == 30
    scores = store.read_scores("sentiment-length", "sentiment")
    assert scores.height == 30 and scores["sentiment"].is_between(0, 1).all()


def test_a_local_run_starts_its_own_ray_beside_a_cluster_on_the_machine(
    head: Head, tmp_path: Path
) -> None:
    """Without RAY_ADDRESS, `ray.init()` attaches to the cluster `ray start --head` recorded in
    the default temp dir (and then refuses the local run's `num_cpus`): a local run must start
    its own Ray and leave that cluster as it was."""
    address_file = Path(head.tmp) / "ray_current_cluster"
    recorded = address_file.read_text()
    assert recorded == f"127.0.0.1:{head.port}"  # what a bare ray.init() would attach to
    before = head.pids()
    env = {k: v for k, v in head.env.items() if k != "RAY_ADDRESS"}  # RAY_TMPDIR stays
    env["PYTHONPATH"] = str(REPO)
    out = tmp_path / "local"
    res = harness(
        "run",
        "examples/tiny.yaml",
        "--out",
        str(out),
        *("--limit", "1", "--samples", "1", "--no-progress"),
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "local Ray: 1 node(s)" in res.stderr and "Ray cluster at" not in res.stderr
    assert RunStore(str(out)).read_generations().height == 2
    assert address_file.read_text() == recorded
    assert core_processes(before) and core_processes(before) <= head.pids()  # still up
    assert head.ray("status", "--address", f"127.0.0.1:{head.port}").returncode == 0


def core_processes(pids: set[int]) -> set[int]:
    """The cluster's GCS and raylet among `pids` (idle workers come and go)."""
    core = set()
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"gcs_server" in cmd or b"raylet" in cmd:
            core.add(pid)
    return core

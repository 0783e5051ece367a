"""Runs that share a cluster, and GPU scorer pools after a node loss
(`ray.cluster_utils.Cluster` on 127.0.0.1, logical GPUs; the scorer runs on CPU).

* Two runs: run A (another driver process) waits for GPU shares the cluster cannot give all
  of, while run B scores and ends normally. Every pool's demand is its own placement groups:
  B's end leaves A's pending bundles in what the autoscaler reads, and A's go when A's driver
  dies. (With `request_resources`, one request per cluster, B's end withdrew A's.)
* Node loss: a GPU node of a 1-GPU-per-actor pool is removed mid-stage; the pool goes on with
  the GPUs left and the stage ends within 60 s. Then a run with `runtime.gpus: 3` on the 2 GPUs
  left starts at once on them, instead of waiting `gpu_wait_s` (900 s) for the lost one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_run import generation_row

from harness.stages.scoring.pool import PoolSettings, Share
from harness.stages.scoring.stage import score_run
from results.run.store import RunStore
from tests.ray_procs import local_cluster
from workers.scorers.base import ScorerContext

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
PERPLEXITY = [("perplexity", {"model": "tiny-random/gpt2"})]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster("rs") as c:
        c.nodes_gpu = [c.add_node(num_cpus=4, num_gpus=1) for _ in range(2)]
        c.wait_for_nodes()
        yield c


def fake_generations(root: Path, n: int) -> RunStore:
    store = RunStore(str(root))
    rows = [generation_row(f"j{i:04d}", continuation=f" was number {i}") for i in range(n)]
    for start in range(0, n, 50):
        store.write_generations(rows[start : start + 50])
    return store


def score(store: RunStore, pools: PoolSettings, batch: int = 4) -> dict[str, Any]:
    return score_run(
        store, PERPLEXITY, ScorerContext(device="cpu"), use_ray=True, batch_size=batch,
        progress=False, pools=pools,
    )  # fmt: skip


def pending_gpu_bundles(address: str) -> list[float]:
    """The GPU shares of the placement-group bundles the autoscaler sees as unmet demand."""
    from ray._raylet import GcsClient
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    state = get_cluster_resource_state(GcsClient(address))
    return sorted(
        float(r.resources_bundle.get("GPU", 0))
        for gang in state.pending_gang_resource_requests
        for r in gang.requests
    )


RUN_A = """
import sys, ray
sys.path[:0] = [{repo!r}, {tests!r}]
from harness.stages.scoring.pool import PoolSettings, Share
from harness.stages.scoring.stage import ScoringError
from test_cluster_shared import fake_generations, score
ray.init(address={address!r})
store = fake_generations(__import__("pathlib").Path({out!r}), 8)
try:  # 4 actors of 0.75 GPU on two 1-GPU nodes: 2 placed, 2 waited for
    score(store, PoolSettings(gpu_wait_s=300, shares={{"perplexity": Share(4, 0.75)}}))
except ScoringError as exc:
    print(exc)
"""


def test_two_runs_on_one_cluster_keep_their_demand_apart(cluster: Any, tmp_path: Path) -> None:
    code = RUN_A.format(
        repo=str(REPO), tests=str(REPO / "tests"), address=cluster.address, out=str(tmp_path / "a")
    )
    run_a = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    try:
        deadline = time.monotonic() + 90
        while pending_gpu_bundles(cluster.address) != [0.75, 0.75]:
            assert run_a.poll() is None and time.monotonic() < deadline, "run A's demand"
            time.sleep(0.5)
        # run B: two quarter-GPU actors in the room A leaves; it ends normally
        store_b = fake_generations(tmp_path / "b", 16)
        stats = score(store_b, PoolSettings(gpu_wait_s=60, shares={"perplexity": Share(2, 0.25)}))
        assert stats["perplexity"]["scored"] == 16 and len(stats["perplexity"]["actors"]) == 2
        assert pending_gpu_bundles(cluster.address) == [0.75, 0.75]  # A's demand stands
        assert run_a.poll() is None
    finally:
        run_a.kill()
        run_a.wait(30)
    deadline = time.monotonic() + 30  # A's driver is gone, and its groups with it
    while pending_gpu_bundles(cluster.address) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert pending_gpu_bundles(cluster.address) == []


def test_after_a_node_loss_gpu_scoring_goes_on_with_the_gpus_left(
    cluster: Any, tmp_path: Path
) -> None:
    from harness.stages.generation.ray_runtime import cluster_gpus

    lost = cluster.add_node(num_cpus=4, num_gpus=1)
    cluster.wait_for_nodes()
    assert cluster_gpus() == 3
    store = fake_generations(tmp_path / "run", 1200)
    whole = PoolSettings(shares={"perplexity": Share(num_gpus=1)}, flush_rows=40)
    result: dict[str, Any] = {}

    def body() -> None:
        try:
            result["stats"] = score(store, whole)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            result["error"] = exc

    runner = threading.Thread(target=body)
    runner.start()
    scores = tmp_path / "run" / "scores" / "perplexity"
    deadline = time.monotonic() + 120
    while not (scores.is_dir() and any(scores.glob("*.parquet"))):  # the pool is scoring
        assert runner.is_alive() and time.monotonic() < deadline, result
        time.sleep(0.2)
    cluster.remove_node(lost)
    removed = time.monotonic()
    runner.join(timeout=300)
    took = time.monotonic() - removed
    if "error" in result:
        raise result["error"]
    stats = result["stats"]["perplexity"]
    assert stats["scored"] == 1200 and took < 60, took
    ends = [a["end"] for a in stats["actors"]]
    assert sum(e.startswith("died") for e in ends) == 1 and len(ends) == 3, ends
    # a new run asks for 3 GPUs (runtime.gpus: 3) on the 2 left: re-planned for 2, at once
    again = fake_generations(tmp_path / "again", 16)
    start = time.monotonic()
    stats = score(again, PoolSettings(gpus=3, shares={"perplexity": Share(num_gpus=1)}))
    assert len(stats["perplexity"]["actors"]) == 2 and stats["perplexity"]["scored"] == 16
    assert time.monotonic() - start < 60

"""A replacement after a node loss starts on a live node the first time
(`ray.cluster_utils.Cluster`, 127.0.0.1: a CPU-only head and three nodes of one logical GPU).

Ray sees an actor's death some seconds before it marks the actor's node dead; a replacement
created in the old reservation meanwhile went to the dead node, died there, and only the one
after it found a live node (docs/cluster.md, Node loss).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from harness import driver
from harness.config import parse_config
from harness.stages.generation import planning
from harness.stages.generation.stage import generate_stage
from results.run.store import RunStore
from tests.ray_procs import local_cluster

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster("rr", node_gpus=(1, 1, 1)) as c:
        yield c


class RemoveANode:
    """Observer: after the 3rd finished batch, removes the node of the actor that ran it;
    until the replacement is ready, each finished batch holds the loop 0.5 s (the work must
    not run out first: up to ~80 s for the replacement to start on a loaded machine)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.ready: dict[str, dict[str, Any]] = {}
        self.batches = 0
        self.removed: tuple[str, str] | None = None  # (actor name, node id)
        self.died: list[str] = []

    def __call__(self, event: str, details: dict[str, Any]) -> None:
        if event == "actor_ready":
            self.ready[details["name"]] = details
        elif event == "actor_died":
            self.died.append(details["name"])
        if event != "batch_done":
            return
        self.batches += 1
        if self.removed is None and self.batches >= 3:
            name = details["name"]
            node_id = self.ready[name]["node_id"]
            node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
            self.cluster.remove_node(node, allow_graceful=False)  # as a machine that is lost
            self.removed = (name, node_id)
        elif self.removed is not None and len(self.ready) < 3:
            time.sleep(0.5)


def test_a_replacement_after_a_node_loss_starts_on_a_live_node(
    cluster: Any, tmp_path: Path
) -> None:
    files = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}
    cfg = parse_config(
        {
            "name": "replace-test",
            "dataset": {"kind": "paired-jsonl", "files": files, "limit": 2},
            "models": [{"id": "tiny-random/gpt2", "replicas": 2, "num_gpus": 1}],
            "methods": ["vanilla"],
            "tasks": ["sentiment"],
            "samples_per_prompt": 40,
            "generation": {"max_new_tokens": 4},
            "runtime": {"batch_size": 1, "device": "cpu", "actor_start_timeout_s": 120},
        }
    )
    store = RunStore(str(tmp_path / "run"))
    words = driver.load_words(cfg)
    jobs = planning.plan(cfg, words)
    planning.plan_stage(store, cfg, words)
    chaos = RemoveANode(cluster)
    stats = generate_stage(store, cfg, jobs, words, use_ray=True, progress=False, observer=chaos)

    assert chaos.removed is not None, "the node must be lost mid-run"
    lost_actor, lost_node = chaos.removed
    replacement = lost_actor + ".1"  # the slot's first replacement
    assert chaos.died == [lost_actor], chaos.died  # no replacement died on the lost node
    assert replacement in chaos.ready, (chaos.ready.keys(), stats["actors"])
    # Ray marks a lost node dead only after missing its heartbeats (~10 s or more): a run that
    # ends sooner (an idle machine) must wait for that before reading which nodes live.
    deadline = time.monotonic() + 90
    live = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    while lost_node in live and time.monotonic() < deadline:
        time.sleep(1)
        live = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert lost_node not in live and chaos.ready[replacement]["node_id"] in live
    by_name = {a["worker"]: a for a in stats["actors"]}
    assert by_name[replacement]["jobs"] > 0 and lost_actor + ".2" not in by_name
    gens = store.read_generations()
    assert sorted(gens["job_id"]) == sorted(j.job_id for j in jobs)
    assert (gens["status"] == "ok").all()

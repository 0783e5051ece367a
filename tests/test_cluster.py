"""The generation stage on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`, 127.0.0.1).

One cluster for the module: a CPU-only head (no actors) and three worker nodes declaring logical
GPUs (1, 1 and 2), so placement by `num_gpus` is exercised without CUDA; models run on CPU.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import ray

from harness import driver
from harness.config import RunConfig, parse_config
from harness.stages.generation import planning
from harness.stages.generation.stage import generate_stage
from jobs.spec import JobSpec
from results.run.store import RunStore
from tests.aws_env import aws_test_env
from tests.ray_procs import listening_addresses, local_cluster, loopback_only, process_tree

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # Nodes pass their environment to actors: credentials for the local S3 stand-in (moto).
    with aws_test_env(), local_cluster("rc", node_gpus=(1, 1, 2)) as c:
        yield c


def make_config(models: list[dict[str, Any]], limit: int = 5, samples: int = 4) -> RunConfig:
    files = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}
    return parse_config(
        {
            "name": "cluster-test",
            "dataset": {"kind": "paired-jsonl", "files": files, "limit": limit},
            "models": models,
            "methods": ["vanilla"],
            "tasks": ["sentiment"],
            "samples_per_prompt": samples,
            "generation": {"max_new_tokens": 16},
            # device cpu: the GPUs are logical; short timeouts keep a broken test from hanging
            "runtime": {
                "batch_size": 2,
                "device": "cpu",
                "actor_start_timeout_s": 120,
                "progress_log_s": 5,
            },
        }
    )


def planned(cfg: RunConfig, out: Path | str) -> tuple[RunStore, list[JobSpec], Any]:
    store = RunStore(str(out))
    words = driver.load_words(cfg)
    jobs = planning.plan(cfg, words)
    planning.plan_stage(store, cfg, words)
    return store, jobs, words


def test_the_cluster_listens_on_127_0_0_1_only(cluster: Any) -> None:
    addresses = listening_addresses(process_tree(roots=[os.getpid()]))
    assert len(addresses) > 10 and loopback_only(addresses), sorted(addresses)


def test_replicas_are_placed_by_their_gpu_share(cluster: Any, tmp_path: Path) -> None:
    """A model asking for 2 GPUs gets the 2-GPU node; half-GPU replicas share GPUs."""
    cfg = make_config(
        [
            {"id": "tiny-random/gpt2", "num_gpus": 2, "replicas": 1},
            {"id": "tiny-random/opt", "num_gpus": 0.5, "replicas": 2},
        ],
        limit=2,
        samples=2,
    )
    store, jobs, words = planned(cfg, tmp_path / "run")
    stats = generate_stage(store, cfg, jobs, words, use_ray=True, progress=False)
    gens = store.read_generations()
    assert gens.height == len(jobs) and (gens["status"] == "ok").all()
    by_model: dict[str, list[dict[str, Any]]] = {}
    for actor in stats["actors"]:
        by_model.setdefault(actor["model"], []).append(actor)
    (wide,) = by_model["tiny-random/gpt2"]
    node_gpus = {n["NodeID"]: n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]}
    assert len(wide["gpu_ids"]) == 2 and node_gpus[wide["node_id"]] == 2
    # Two half-GPU replicas were started; one may be released before it reports its placement
    # (its model's queue ran dry while it loaded). Each one that reported holds one GPU.
    halves = by_model["tiny-random/opt"]
    assert len(halves) == 2
    placed = [a["gpu_ids"] for a in halves if a["gpu_ids"] is not None]
    assert placed and all(len(ids) == 1 for ids in placed)
    # an actor whose model ran out of work while it loaded ends "not needed"
    assert all(a["end"] in ("released", "not needed") for a in stats["actors"]), stats["actors"]
    assert sum(a["jobs"] for a in stats["actors"]) == len(jobs)


def test_an_object_store_run_directory_is_written_by_the_actors_and_read_by_the_driver(
    cluster: Any, tmp_path: Path
) -> None:
    """--out s3://... (a local S3 stand-in): the plan, every actor's shards, one place."""
    moto_server = pytest.importorskip("moto.server")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket="runs")
        cfg = make_config(
            [{"id": "tiny-random/gpt2", "replicas": 2, "num_gpus": 1}], limit=3, samples=2
        )
        uri = f"s3://runs/cluster-test?endpoint_override={host}:{port}&scheme=http"
        store, jobs, words = planned(cfg, uri)
        stats = generate_stage(store, cfg, jobs, words, use_ray=True, progress=False)
        gens = RunStore(uri).read_generations()
        assert sorted(gens["job_id"]) == sorted(j.job_id for j in jobs)
        assert (gens["status"] == "ok").all()
        assert sum(a["jobs"] for a in stats["actors"]) == len(jobs) and not list(tmp_path.iterdir())
    finally:
        server.stop()


def test_a_killed_actor_and_a_lost_node_change_nothing_in_the_outputs(
    cluster: Any, tmp_path: Path
) -> None:
    cfg = make_config([{"id": "tiny-random/gpt2", "replicas": 2, "num_gpus": 1}])
    reference, jobs, words = planned(cfg, tmp_path / "reference")
    # The undisturbed outputs, generated in this process.
    generate_stage(reference, cfg, jobs, words, use_ray=False, progress=False)
    store, _, _ = planned(cfg, tmp_path / "run")
    chaos = Chaos(cluster)
    stats = generate_stage(store, cfg, jobs, words, use_ray=True, progress=False, observer=chaos)

    assert chaos.killed and chaos.removed, "the faults must hit mid-run"
    shards = (tmp_path / "run" / "generations").glob("part-*.parquet")
    rows = pl.concat([pl.read_parquet(p) for p in shards])
    assert sorted(rows["job_id"]) == sorted(j.job_id for j in jobs)  # every job exactly once
    assert (rows["status"] == "ok").all()
    want = reference.read_generations().select("job_id", "continuation", "token_ids")
    got = rows.select("job_id", "continuation", "token_ids")
    assert got.sort("job_id").equals(want.sort("job_id"))  # per-job determinism across restarts
    ends = [a["end"] for a in stats["actors"]]
    assert sum(e.startswith("died") for e in ends) >= 2 and len(ends) >= 4
    assert stats["models"]["tiny-random/gpt2"]["done"] == len(jobs)


class Chaos:
    """Observer that SIGKILLs one actor after the 3rd batch and removes another's node after the 6th."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.actors: dict[str, dict[str, Any]] = {}
        self.batches = 0
        self.killed: str | None = None
        self.removed: str | None = None

    def __call__(self, event: str, details: dict[str, Any]) -> None:
        if event == "actor_ready":
            self.actors[details["name"]] = details
        if event != "batch_done":
            return
        self.batches += 1
        name = details["name"]
        if self.killed is None and self.batches >= 3:
            os.kill(self.actors[name]["pid"], signal.SIGKILL)
            self.killed = name
        elif self.removed is None and self.batches >= 6 and name != self.killed and "." not in name:
            node_id = self.actors[name]["node_id"]
            node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
            self.cluster.remove_node(node)
            self.removed = name

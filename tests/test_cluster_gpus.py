"""GPU placement on a cluster whose GPU nodes join late (`ray.cluster_utils.Cluster`, 127.0.0.1).

The head has no GPU; in the middle of the module three nodes with one logical GPU each join
while the paper config waits for them (one before it starts, two during its wait), and at the
end a fourth joins during a run with `runtime.gpus` unset. Models and scorers run on CPU
(`device: cpu`) with an explicit `num_gpus`, so the GPU resources are Ray's logical ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import ray
import yaml
from fake_run import generation_row

from harness import driver
from harness.config import RunConfig, parse_config
from harness.stages.generation import planning
from harness.stages.generation.ray_runtime import cluster_gpus, cluster_mode
from harness.stages.generation.stage import GenerationError, generate_stage
from harness.stages.scoring.pool import PoolSettings, Share
from harness.stages.scoring.stage import ScoringError, score_run
from results.run.store import RunStore
from tests.ray_procs import local_cluster
from workers.scorers.base import ScorerContext

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
NODE_GPUS = (1, 1, 1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster("rg") as c:  # the GPU nodes join in the tests
        yield c


def paper_config(model: dict[str, Any], **runtime: Any) -> RunConfig:
    """examples/paper-gpt2-large.yaml with the tiny model, local prompts, no downloads."""
    data = yaml.safe_load((REPO / "examples" / "paper-gpt2-large.yaml").read_text())
    files = {g: str(REPO / "examples" / "data" / f"pairs-{g}.jsonl") for g in ("female", "male")}
    data["dataset"] = {"kind": "paired-jsonl", "files": files, "limit": 1}
    data.pop("gender_words")
    data["methods"] = ["vanilla"]  # the others need the UDDIA head (a download)
    data["models"] = [model]
    data["generation"]["max_new_tokens"] = 8
    data["runtime"].update({"batch_size": 2, "actor_start_timeout_s": 120, "progress_log_s": 5})
    data["runtime"].update(runtime)
    return parse_config(data, "paper-gpt2-large.yaml (test)")


def planned(cfg: RunConfig, out: Path) -> tuple[RunStore, list[Any], Any]:
    store = RunStore(str(out))
    words = driver.load_words(cfg)
    jobs = planning.plan(cfg, words)
    planning.plan_stage(store, cfg, words)
    return store, jobs, words


def fake_generations(root: Path, n: int) -> RunStore:
    store = RunStore(str(root))
    rows = [generation_row(f"j{i:03d}", continuation=f" was number {i} and kind") for i in range(n)]
    for start in range(0, n, 8):
        store.write_generations(rows[start : start + 8])
    return store


def test_without_gpus_the_paper_config_fails_after_the_wait(cluster: Any, tmp_path: Path) -> None:
    assert cluster_mode() and cluster_gpus() == 0
    cfg = paper_config({"id": "tiny-random/gpt2"}, gpu_wait_s=2)
    store, jobs, words = planned(cfg, tmp_path / "run")
    with pytest.raises(GenerationError) as err:
        generate_stage(store, cfg, jobs, words, use_ray=True, progress=False)
    message = str(err.value)
    assert "needs 1 GPU(s) but the cluster has 0 after waiting 2s" in message
    assert "runtime: {device: cpu}" in message and "ray status" in message
    assert store.done_job_ids() == set()  # nothing ran on a CPU instead


def test_without_gpus_a_gpu_scorer_fails_and_the_others_score(cluster: Any, tmp_path: Path) -> None:
    assert cluster_gpus() == 0
    store = fake_generations(tmp_path / "run", 8)
    scorers = [("perplexity", {"model": "tiny-random/gpt2"}), ("gender", {})]
    with pytest.raises(ScoringError, match=r"perplexity: cannot start: .*needs 1 GPU") as err:
        score_run(
            store, scorers, ScorerContext(), use_ray=True, progress=False,
            pools=PoolSettings(gpu_wait_s=1),
        )  # fmt: skip
    assert err.value.stats["gender"]["scored"] == 8 and "perplexity" not in store.scorers()


def score_perplexity(store: RunStore, pools: PoolSettings) -> dict[str, dict[str, Any]]:
    """The tiny GPT-2's perplexity on the cluster, on CPU, 4 rows a chunk."""
    return score_run(
        store,
        [("perplexity", {"model": "tiny-random/gpt2"})],
        ScorerContext(device="cpu"),
        use_ray=True,
        batch_size=4,
        progress=False,
        pools=pools,
    )


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `fn` in a thread (nodes can only be added from the main thread); its result or
    exception lands in the dict."""
    result: dict[str, Any] = {}

    def body() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:  # noqa: BLE001 - re-raised by the test
            result["error"] = exc

    runner = threading.Thread(target=body)
    runner.start()
    return runner, result


def test_late_gpu_nodes_each_get_a_replica_while_a_gpu_scorer_follows(
    cluster: Any, tmp_path: Path
) -> None:
    """The GPUs are reserved (a placement group per replica) before the scorer that follows
    generation starts: its quarter-GPU actors cannot take the first node's GPU, so every
    replica starts, one per node, though the nodes join one by one. The stage's loop is slowed
    (0.1 s per finished batch) until the three are ready, so the work cannot run out first."""
    import functools

    assert cluster_gpus() == 0
    cfg = paper_config(
        {"id": "tiny-random/gpt2", "num_gpus": 1},
        device="cpu",
        gpu_wait_s=120,
        gpus=3,
        batch_size=1,
        score_during_generation=True,
    )
    perplexity = {"name": "perplexity", "num_gpus": 0.25, "params": {"model": "tiny-random/gpt2"}}
    cfg = cfg.model_copy(update={"scorers": parse_scorers([perplexity]), "samples_per_prompt": 30})
    store = RunStore(str(tmp_path / "run"))
    words = driver.load_words(cfg)
    the_plan = driver.plan_stage(store, cfg, words)
    ready = slowed_until(3)
    stage = functools.partial(driver.generate_stage, observer=ready.observe)
    cluster.add_node(num_cpus=2, num_gpus=NODE_GPUS[0])  # one GPU is there from the start
    with mock.patch.object(driver, "generate_stage", stage):
        runner, result = in_thread(
            lambda: driver.generation_stage(store, cfg, the_plan, words, True, False)
        )
        time.sleep(1.5)
        assert runner.is_alive() and cluster_gpus() == 1  # waiting for the budget's other GPUs
        for gpus in NODE_GPUS[1:]:
            cluster.add_node(num_cpus=2, num_gpus=gpus)
        runner.join(timeout=300)
    if "error" in result:
        raise result["error"]
    stats, error, followed = result["value"]
    followed.close(now=True)
    assert error is None, error
    assert stats["models"]["tiny-random/gpt2"]["replicas"] == 3
    assert len(stats["actors"]) == 3 and all(a["num_gpus"] == 1 for a in stats["actors"])
    placed = {(d["node_id"], tuple(d["gpu_ids"])) for d in ready.seen}
    assert len(ready.seen) == 3 and len({node for node, _ in placed}) == 3, ready.seen
    assert all(a["jobs"] > 0 for a in stats["actors"])
    gens = store.read_generations()
    assert gens.height == the_plan.planned and (gens["status"] == "ok").all()


class slowed_until:  # noqa: N801 - used as a function
    """A stage observer: records ready actors; until `n` are ready, each finished batch holds
    the stage's loop `delay_s` (so a replica that starts late still finds work)."""

    def __init__(self, n: int, delay_s: float = 0.1) -> None:
        self.n, self.delay_s = n, delay_s
        self.seen: list[dict[str, Any]] = []

    def observe(self, event: str, details: dict[str, Any]) -> None:
        if event == "actor_ready":
            self.seen.append(details)
        elif event == "batch_done" and len(self.seen) < self.n:
            time.sleep(self.delay_s)


def parse_scorers(entries: list[Any]) -> list[Any]:
    from harness.config import ScorerConfig

    return [ScorerConfig(**e) for e in entries]


def test_a_cpu_replica_runs_torch_with_its_cpus(cluster: Any, tmp_path: Path) -> None:
    cfg = paper_config({"id": "tiny-random/gpt2", "num_cpus": 2}, device="cpu")
    store, jobs, words = planned(cfg, tmp_path / "run")
    ready: list[dict[str, Any]] = []
    stats = generate_stage(
        store,
        cfg,
        jobs[:4],
        words,
        use_ray=True,
        progress=False,
        observer=lambda e, d: ready.append(d) if e == "actor_ready" else None,
    )
    (actor,) = stats["actors"]
    assert actor["num_gpus"] == 0 and actor["num_cpus"] == 2 and actor["device"] == "cpu"
    assert [d["threads"] for d in ready] == [2] and actor["threads"] == 2  # in the manifest too


def test_a_gpu_scorer_pool_uses_every_gpu_node(cluster: Any, tmp_path: Path) -> None:
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    assert len(nodes) == 3
    store = fake_generations(tmp_path / "run", 16)
    pools = PoolSettings(shares={"perplexity": Share(num_gpus=1)})
    stats = score_perplexity(store, pools)
    actors = stats["perplexity"]["actors"]
    assert len(actors) == 3 and all(a["num_gpus"] == 1 for a in actors)
    worked = {a["node_id"] for a in actors if a["chunks"]}
    assert worked == {n["NodeID"] for n in nodes}
    assert sum(a["rows"] for a in actors) == 16 == stats["perplexity"]["scored"]
    scores = store.read_scores("perplexity", "perplexity")
    assert scores.height == 16 and (scores["status"] == "ok").all()


def test_a_call_past_its_timeout_replaces_the_actor_and_the_stage_ends(
    cluster: Any, tmp_path: Path
) -> None:
    """A hung scorer must not stall the stage: every call here outlives a 1 ms timeout."""
    store = fake_generations(tmp_path / "run", 16)
    pools = PoolSettings(
        call_timeout_s=0.001, chunk_retries=0, shares={"perplexity": Share(1, 0.0)}
    )
    with pytest.raises(ScoringError, match=r"no actor left \(last: call timed out\)") as err:
        score_perplexity(store, pools)
    stats = err.value.stats["perplexity"]
    assert [a["end"] for a in stats["actors"]] == ["call timed out"] * 3  # 2 replacements
    assert stats["failed_chunks"] == 3 and "perplexity" not in store.scorers()


def test_with_gpus_auto_a_node_that_joins_during_the_run_gets_a_replica(
    cluster: Any, tmp_path: Path
) -> None:
    """`runtime.gpus: auto`: one replica per GPU at the start (3), and one more for the GPU
    node that joins while the model still has batches. The stage's loop is slowed (0.3 s per
    finished batch) only until that replica is ready, so the work cannot run out first."""
    import harness.stages.generation.reservation as reservation

    assert cluster_gpus() == 3
    cfg = paper_config(
        {"id": "tiny-random/gpt2", "num_gpus": 1}, device="cpu", batch_size=1, gpus="auto"
    )
    cfg = cfg.model_copy(update={"samples_per_prompt": 100})
    assert cfg.runtime.gpus is None
    store, jobs, words = planned(cfg, tmp_path / "run")
    slowed = slowed_until(4, delay_s=0.3)  # at most 60 s for the 200 batches
    ready = slowed.seen
    old_poll, reservation.GROW_POLL_S = reservation.GROW_POLL_S, 0.2
    node = None
    try:
        runner, result = in_thread(
            lambda: generate_stage(
                store, cfg, jobs, words, use_ray=True, progress=False, observer=slowed.observe
            )
        )
        deadline = time.monotonic() + 120
        while len(ready) < 3 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(ready) == 3, "the three replicas of the budget did not start"
        node = cluster.add_node(num_cpus=2, num_gpus=1)
        runner.join(timeout=300)
    finally:
        reservation.GROW_POLL_S = old_poll
    if "error" in result:
        raise result["error"]
    stats = result["value"]
    actors = stats["actors"]
    assert len(actors) == 4 and len({d["node_id"] for d in ready}) == 4
    assert ready[3]["node_id"] == node.node_id  # the new node's replica
    assert sum(a["jobs"] for a in actors) == len(jobs) and actors[3]["jobs"] > 0
    gens = store.read_generations()
    assert gens.height == len(jobs) and (gens["status"] == "ok").all()
    cluster.remove_node(node)

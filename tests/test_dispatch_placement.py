"""Where generation replicas go and how large their batches are: the placement of a model's
replicas, the automatic batch size (from the GPUs the driver sees in-process), the GPU budget
split between models, and whole GPUs above one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.config import ModelConfig
from harness.stages.generation.backends import Placement
from harness.stages.generation.stage import batch_jobs, placement


@pytest.mark.parametrize(
    ("entry", "gpus", "device", "expected"),
    [
        ({}, 4.0, None, Placement(4, 1.0, 1.0, "cuda")),  # one replica per GPU
        ({"num_gpus": 0.5}, 2.0, None, Placement(4, 0.5, 1.0, "cuda")),  # two per GPU
        ({"num_gpus": 2}, 4.0, None, Placement(2, 2.0, 1.0, "auto")),  # one replica over 2 GPUs
        ({}, 0.0, None, Placement(1, 0.0, 1.0, "cpu")),  # CPU-only cluster
        ({"replicas": 3}, 0.0, None, Placement(3, 0.0, 1.0, "cpu")),
        ({"num_gpus": 1, "replicas": 6}, 0.0, None, Placement(6, 1.0, 1.0, "cuda")),  # autoscaling
        ({"num_gpus": 1}, 2.0, "cpu", Placement(2, 1.0, 1.0, "cpu")),  # runtime.device wins
    ],
)
def test_placement_of_replicas(
    entry: dict[str, Any], gpus: float, device: str | None, expected: Placement
) -> None:
    assert placement(ModelConfig(id="m", **entry), gpus, device) == expected


@pytest.mark.parametrize(
    ("size", "where", "pending", "expected"),
    [
        (32, Placement(4, 1.0, 1.0, "cuda"), 10_000, 32),  # a number is used as given
        ("auto", Placement(1, 0.0, 1.0, "cpu"), 10_000, 8),  # CPU replicas
        ("auto", Placement(4, 1.0, 1.0, "cuda"), 10_000, 256),  # GPU: the cap
        ("auto", Placement(2, 1.0, 1.0, "cuda"), 1_000, 250),  # two batches per replica
        ("auto", Placement(2, 2.0, 1.0, "auto"), 100, 25),  # one replica over 2 GPUs
        ("auto", Placement(4, 0.5, 1.0, "cuda"), 20, 8),  # never below the CPU size
        ("auto", Placement(1, 0.0, 1.0, "cuda:1"), 600, 256),  # runtime.device: cuda:1
    ],
)
def test_auto_batch_size_fills_gpu_replicas_and_keeps_cpu_batches_small(
    size: int | str, where: Placement, pending: int, expected: int
) -> None:
    assert batch_jobs(size, where, pending) == expected


def test_auto_batch_size_in_process_follows_the_gpus_the_driver_sees(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--no-ray without runtime.device: GPU batches where NVIDIA's driver lists a GPU that
    CUDA_VISIBLE_DEVICES leaves visible; told without importing torch."""
    import harness.stages.generation.stage as generation

    proc = tmp_path / "gpus"
    proc.mkdir()
    here = Placement(1, 0.0, 0.0, "")
    probe = generation.visible_gpus
    seen = lambda: probe(str(proc))  # noqa: E731
    monkeypatch.setattr(generation, "visible_gpus", seen)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert seen() == 0 and batch_jobs("auto", here, 5_000) == 8
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (proc / bus).mkdir()
    assert seen() == 2 and batch_jobs("auto", here, 5_000) == 256
    for visible, count in (("1", 1), ("", 0), ("-1", 0), ("0,1,2", 2)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert seen() == count, visible
    assert batch_jobs("auto", here, 5_000) == 256
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert batch_jobs("auto", here, 5_000) == 8


def test_the_budget_is_split_between_models_and_printed() -> None:
    from harness.config import RuntimeConfig
    from harness.stages.generation.reservation import budget_for, request_budget

    two = [ModelConfig(id="a"), ModelConfig(id="b")]
    b = budget_for(two, None, 4, None)
    assert b.replicas == {"a": 2, "b": 2} and b.gpus == 4  # not 4 each: 8
    assert b.line() == "GPU budget: 4 GPU(s) (runtime.gpus: 4; a: 2 × 1 GPU, b: 2 × 1 GPU)"
    fixed = [ModelConfig(id="a", replicas=1, num_gpus=2), ModelConfig(id="b", num_gpus=0.5)]
    b = budget_for(fixed, None, 4, None, gpus_per_node=4)
    assert b.replicas == {"a": 1, "b": 4} and b.gpus == 4 and b.nodes == 1
    b = budget_for(two, None, 1, None)
    assert b.gpus == 2 and "above runtime.gpus: 1" in b.line()  # one replica each at least
    auto = budget_for(two, None, None, None, gpus_per_node=1)
    assert auto.gpus == 2 and auto.nodes == 2 and auto.line().startswith("GPU budget: auto")
    assert budget_for(two, None, None, 6.0).replicas == {"a": 3, "b": 3}
    assert budget_for(two, "cpu", 4, None).replicas == {}  # CPU replicas hold no GPU
    assert budget_for(two, None, 8, None, cap=2.0).gpus == 2  # a local Ray has what it has
    cfg = make_config_for_budget(RuntimeConfig(gpus="auto"))  # type: ignore[arg-type]
    assert cfg.runtime.gpus is None and request_budget(cfg, cluster_gpus=3).gpus == 3


def make_config_for_budget(runtime: Any) -> Any:
    from harness.config import parse_config

    data = {
        "name": "budget",
        "dataset": {"kind": "prompt-list", "path": "p.jsonl"},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "scorers": ["gender"],
    }
    cfg = parse_config(data, "budget.yaml")
    return cfg.model_copy(update={"runtime": runtime})


def test_fractional_gpus_above_one_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_gpus above 1 must be a whole number"):
        ModelConfig(id="m", num_gpus=1.5)

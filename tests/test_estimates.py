"""The generation time estimates of `validate` (harness/cli/estimates.py): any model, any
device, never "none"; they scale with the model's parameters and the replicas, take GPU figures
for GPU replicas and CPU figures for CPU ones, and count the replicas `run` would choose."""

from __future__ import annotations

from typing import Any

import pytest

from harness.cli.estimates import (
    GPU_TOKENS_PER_S,
    MEASURED_TOKENS_PER_S,
    Site,
    generation_estimates,
    generation_sites,
)
from harness.config import parse_config
from harness.stages.generation import cpu_sizing
from harness.stages.generation.cpu_sizing import GIB, RESERVE_BYTES, Machine


def config(model: str = "openai-community/gpt2", methods: Any = ("vanilla",), **extra: Any) -> Any:
    data = {
        "name": "est",
        "dataset": {"kind": "prompt-list", "path": "p.jsonl"},
        "models": [{"id": model}],
        "methods": list(methods),
        "tasks": ["sentiment"],
        "generation": {"max_new_tokens": 20},
        **extra,
    }
    return parse_config(data, "est.yaml")


def seconds(cfg: Any, site: Site, jobs: int = 100) -> float:
    (est,) = generation_estimates(cfg, jobs, {0: site})
    assert est.seconds is not None
    return est.seconds


def test_estimates_scale_with_parameters_and_replicas() -> None:
    small, large = config("openai-community/gpt2"), config("openai-community/gpt2-large")
    for gpu in (False, True):
        assert seconds(large, Site(gpu, 1)) / seconds(small, Site(gpu, 1)) == pytest.approx(
            774 / 124
        )
        assert seconds(small, Site(gpu, 4)) == pytest.approx(seconds(small, Site(gpu, 1)) / 4)


def test_gpu_replicas_take_the_gpu_figures_and_cpu_replicas_the_cpu_ones() -> None:
    cfg = config("openai-community/gpt2-large")
    tokens = 100 * 20
    assert seconds(cfg, Site(True, 1)) == pytest.approx(tokens / GPU_TOKENS_PER_S["vanilla"])
    cpu_rate = MEASURED_TOKENS_PER_S["context"]["vanilla"] * 124 / 774
    assert seconds(cfg, Site(False, 1)) == pytest.approx(tokens / cpu_rate)
    (gpu,) = generation_estimates(cfg, 100, {0: Site(True, 2)})
    assert "on 2 GPU replica(s)" in gpu.line() and "H100" in gpu.line()
    (cpu,) = generation_estimates(cfg, 100, {0: Site(False, 2)})
    assert "on 2 CPU replica(s)" in cpu.line() and "2-core CPU" in cpu.line()


def test_an_unknown_model_and_an_unmeasured_method_are_estimated_and_named() -> None:
    cfg = config("someone/mystery-model", ("vanilla", "pplm", "gedi"))
    (est,) = generation_estimates(cfg, 50, {0: Site(False, 1)})
    assert est.seconds is not None and est.seconds > 0 and "none" not in est.line()
    assert "assumed" in est.line()  # the size: said how it was had
    assert "at the slowest measured speed (no measurement): pplm, gedi" in est.line()
    slowest = min(MEASURED_TOKENS_PER_S["context"].values())
    vanilla = MEASURED_TOKENS_PER_S["context"]["vanilla"]
    expected = 50 * 20 * (1 / vanilla + 2 / slowest) * 1e9 / 124e6
    assert est.seconds == pytest.approx(expected)


def test_sites_follow_the_device_the_budget_and_this_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from harness.cli import machine

    monkeypatch.setattr(machine, "local_gpus", lambda: (0, "no GPU here"))
    monkeypatch.setattr(cpu_sizing, "machine_here", lambda: Machine(4, 32 * GIB + RESERVE_BYTES))
    # a local Ray without GPUs: the CPU replicas `run` would choose (4 cores: 4 replicas)
    (site,) = generation_sites(config(), 100, local=True, use_ray=True).values()
    assert (site.gpu, site.replicas) == (False, 4) and site.cpu is not None
    # a cluster: one GPU replica per GPU of the budget; `runtime.device: cpu` keeps it on CPUs
    (site,) = generation_sites(config(runtime={"gpus": 3}), 100, False, True).values()
    assert (site.gpu, site.replicas) == (True, 3)
    (site,) = generation_sites(config(runtime={"device": "cpu"}), 100, False, True).values()
    assert (site.gpu, site.replicas) == (False, 1)
    # a GPU budget validated on this machine: GPU figures, and the note that it has none
    (site,) = generation_sites(config(runtime={"gpus": 8}), 100, True, True).values()
    assert (site.gpu, site.replicas) == (True, 8) and "has none" in site.note
    # explicit replicas win over the sizing
    fixed = config(models=[{"id": "openai-community/gpt2", "replicas": 1}])
    (site,) = generation_sites(fixed, 100, True, True).values()
    assert site.replicas == 1


def test_validate_prints_the_cpu_choice_and_estimates_with_its_replicas(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from harness.cli import machine
    from harness.cli.validate import validate

    monkeypatch.setattr(machine, "local_gpus", lambda: (0, "no GPU here"))
    monkeypatch.setattr(cpu_sizing, "machine_here", lambda: Machine(3, 32 * GIB + RESERVE_BYTES))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": {{"text": "prompt {i} is"}}}}\n' for i in range(12)))
    data = {
        "name": "est",
        "dataset": {"kind": "prompt-list", "path": str(prompts)},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "samples_per_prompt": 2,
        "generation": {"max_new_tokens": 20},
    }
    lines, _ = validate(parse_config(data, "est.yaml"), "est.yaml", probe=lambda url: None)
    (choice,) = [line for line in lines if "generation on CPU:" in line]
    assert choice.strip().startswith("generation on CPU: 3 replicas × 1 thread (cores 3,")
    (est,) = [line for line in lines if "estimate generation" in line]
    assert "on 3 CPU replica(s)" in est
    assert "GPU budget: none (every model runs on CPU replicas)" in "\n".join(lines)

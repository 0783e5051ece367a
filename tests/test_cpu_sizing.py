"""CPU replicas × threads on a local Ray without GPUs (harness/stages/generation/cpu_sizing.py),
CPU scorer pools' threads, and a model's size without loading it (model_size.py): the sizing
decision as a function of cores, memory, model size and the scorers that follow generation,
with explicit settings winning. No timing: what is decided, not how fast it runs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from harness.config import parse_config
from harness.stages.generation import cpu_sizing
from harness.stages.generation.cpu_sizing import (
    GIB,
    RESERVE_BYTES,
    Machine,
    choose,
    cpu_choices,
    cpu_models,
    replica_bytes,
)
from harness.stages.generation.model_size import (
    ModelSize,
    config_params,
    model_size,
    named_size,
)
from workers.gguf import parameter_count as gguf_params


def free(gb: float) -> float:
    """Machine memory that leaves `gb` GiB after the reserve for the driver and Ray."""
    return gb * GIB + RESERVE_BYTES


@pytest.mark.parametrize(
    ("cores", "memory_gb", "each_gb", "batches", "others_gb", "expected"),
    [
        (2, 18.0, 1.3, 6, 0.0, (2, 1, "")),  # this machine: replicas first, one thread each
        (16, 64.0, 1.3, 100, 0.0, (16, 1, "")),  # a laptop with room: one replica per core
        (16, 6.6, 1.3, 100, 0.0, (5, 3, "memory")),  # memory holds 5: threads take the rest
        (16, 10.6, 1.3, 100, 4.0, (5, 3, "memory")),  # a scorer's model takes 4 GB of it
        (16, 2.0, 30.0, 100, 0.0, (1, 16, "memory")),  # a model larger than memory: one, all cores
        (8, 64.0, 1.3, 2, 0.0, (2, 4, "batches")),  # two batches: two replicas of four threads
    ],
)
def test_cores_go_to_replicas_until_memory_or_batches_run_out(
    cores: int,
    memory_gb: float,
    each_gb: float,
    batches: int,
    others_gb: float,
    expected: tuple[int, int, str],
) -> None:
    machine = Machine(cores, free(memory_gb))
    got = choose(machine, each_gb * GIB, batches, others_gb * GIB)
    assert (got.replicas, got.threads, got.limit) == expected
    assert got.replicas * got.threads <= cores
    assert got.num_cpus == got.threads  # Ray's CPUs per replica are its torch threads


def test_explicit_replicas_and_num_cpus_win() -> None:
    machine = Machine(16, free(64.0))
    assert (
        choose(machine, GIB, 100, replicas=3).replicas,
        choose(machine, GIB, 100, replicas=3).threads,
    ) == (3, 5)
    two = choose(machine, GIB, 100, num_cpus=2)  # threads fixed: replicas fill the cores
    assert (two.replicas, two.threads, two.num_cpus) == (8, 2, 2.0)
    both = choose(Machine(2, free(1.0)), 30 * GIB, 1, replicas=4, num_cpus=0.5)
    assert (both.replicas, both.threads, both.num_cpus) == (4, 1, 0.5)  # as given, even past memory
    assert "explicit models.3.replicas/num_cpus win" in both.line(3)


def test_models_generating_at_once_share_the_cores_and_memory() -> None:
    machine = Machine(8, free(8.0))
    alone = choose(machine, GIB, 100)
    shared = choose(machine, GIB, 100, share=2)
    assert (alone.replicas, alone.threads) == (8, 1)
    assert (shared.replicas, shared.threads) == (4, 1)


def test_the_choice_line_says_replicas_threads_machine_and_model() -> None:
    line = choose(Machine(2, free(18.0)), 1.3 * GIB, 6).line(0)
    assert line.startswith("generation on CPU: 2 replicas × 1 thread (cores 2, memory ")
    assert "model ~1.3 GB each; explicit models.0.replicas/num_cpus win)" in line
    held = choose(Machine(8, free(8.0)), GIB, 1).line(1)
    assert "1 replica × 8 threads" in held and "held to 1 by the model's batches" in held


def config(**extra: Any) -> Any:
    data = {
        "name": "cpu",
        "dataset": {"kind": "prompt-list", "path": "p.jsonl"},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        **extra,
    }
    return parse_config(data, "cpu.yaml")


def test_a_perplexity_model_that_follows_generation_leaves_less_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On `runtime.device: cpu` perplexity follows generation: its model (gpt2-xl by default,
    1.5B parameters, ~7.6 GB in float32, forward passes only) is counted before the replicas; on a machine without
    GPUs but the device unset, it scores after generation and is not counted."""
    big = ModelSize(1e9, "test")  # a 1B-parameter generator: ~5.8 GB a replica
    monkeypatch.setattr(
        cpu_sizing,
        "model_size",
        lambda spec, revision=None, gguf=None: (
            big if spec == "tiny-random/gpt2" else model_size(spec, revision)
        ),
    )
    from harness.stages.scoring.follow import followers

    machine = Machine(16, free(20.0))
    pending = {0: [100, 100]}

    def sized(cfg: Any) -> Any:
        return cpu_choices(cfg, pending, followers(cfg), machine)[0]

    alone = sized(config(runtime={"device": "cpu"}))
    following = sized(config(runtime={"device": "cpu"}, scorers=["gender", "perplexity"]))
    after = sized(config(scorers=["gender", "perplexity"]))
    each = replica_bytes(big)
    assert alone.replicas == int(20 * GIB // each)
    ppl_bytes = replica_bytes(model_size("openai-community/gpt2-xl"), factor=1.2)
    assert following.replicas == int((20 * GIB - ppl_bytes) // each) < alone.replicas
    assert after.replicas == alone.replicas
    assert following.threads == 16 // following.replicas


def test_which_models_generate_on_cpu() -> None:
    two = {"models": [{"id": "tiny-random/gpt2"}, {"id": "tiny-random/opt", "num_gpus": 0}]}
    assert cpu_models(config(**two), 0.0) == [0, 1]  # no GPU: all of them
    assert cpu_models(config(**two), 2.0) == [1]  # GPUs: only the one kept off them
    assert cpu_models(config(**two, runtime={"device": "cpu"}), 2.0) == [0, 1]
    asks = {"models": [{"id": "tiny-random/gpt2", "num_gpus": 1}]}
    assert cpu_models(config(**asks), 0.0) == []  # asks for a GPU: it waits for one


def test_a_local_ray_places_cpu_replicas_as_sized_and_logs_the_choice(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`reserve_generation` on a local Ray without GPUs: the sized placement, or the config's."""
    from harness.stages.generation import ray_runtime
    from harness.stages.generation.planning import Plan, SliceCount
    from harness.stages.generation.stage import reserve_generation
    from jobs.grid import SliceKey

    monkeypatch.setattr(ray_runtime, "cluster_gpus", lambda: 0.0)
    monkeypatch.setattr(ray_runtime, "cluster_mode", lambda: False)
    monkeypatch.setattr(cpu_sizing, "machine_here", lambda: Machine(4, free(16.0)))

    def plan_of(cfg: Any) -> Plan:
        ref = cfg.models[0].ref()
        counts = [SliceCount(SliceKey(ref, None, m, "{}", "sentiment"), 40, 40) for m in "ab"]
        return Plan(lambda only, size: iter([]), set(), counts)  # type: ignore[arg-type]

    cfg = config()
    with caplog.at_level("INFO", logger="harness"):
        setup = reserve_generation(cfg, plan_of(cfg))
    (where,) = setup.placements.values()
    assert (where.replicas, where.num_cpus, where.num_gpus, where.device) == (4, 1.0, 0.0, "cpu")
    assert any("generation on CPU: 4 replicas × 1 thread" in r.getMessage() for r in caplog.records)
    fixed = config(models=[{"id": "tiny-random/gpt2", "replicas": 1, "num_cpus": 2}])
    (where,) = reserve_generation(fixed, plan_of(fixed)).placements.values()
    assert (where.replicas, where.num_cpus) == (1, 2.0)


# ---- CPU scorer pools -----------------------------------------------------------------------


def test_cpu_scorer_pools_with_a_model_share_the_cores_as_threads() -> None:
    from harness.stages.scoring.pool import PoolSettings, Share, pool_plans
    from workers.scorers.base import ScorerContext

    scorers = [("perplexity", {}), ("sentiment", {}), ("gender", {}), ("sentiment-vader", {})]
    local = pool_plans(scorers, ScorerContext(), PoolSettings(cores=8), gpus=0)
    assert {n: (p.replicas, p.threads) for n, p in local.items()} == {
        "perplexity": (1, 4),  # two pools with a model: four cores each
        "sentiment": (1, 4),
        "gender": (1, 0),  # no model: one thread (its CPUs)
        "sentiment-vader": (1, 0),
    }
    assert local["perplexity"].num_cpus == 0.5  # Ray's share stays small: generation keeps its own
    cluster = pool_plans(scorers, ScorerContext(), PoolSettings(), gpus=0)  # nodes' cores unknown
    assert all(p.threads == 0 for p in cluster.values())
    given = PoolSettings(cores=8, shares={"perplexity": Share(replicas=2)})
    assert pool_plans(scorers[:1], ScorerContext(), given, gpus=0)["perplexity"].replicas == 2


def test_threads_reach_the_actor_as_torch_threads() -> None:
    from harness.stages.generation.backends import cpu_threads

    assert cpu_threads(0.5) == 1 and cpu_threads(3.0) == 3  # from Ray's CPUs
    assert cpu_threads(0.5, 4) == 4  # a placement's own threads


# ---- model size ---------------------------------------------------------------------------


def test_safetensors_headers_give_the_exact_count(tmp_path: Path) -> None:
    header = {
        "a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
        "b": {"dtype": "F32", "shape": [5], "data_offsets": [48, 68]},
        "__metadata__": {"format": "pt"},
    }
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(68))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 999}))
    size = model_size(str(tmp_path))
    assert (size.params, size.source) == (17, "safetensors")


def test_a_gguf_tensor_table_gives_the_exact_count(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # arrays of strings skipped
    writer.add_uint32("llama.block_count", 2)
    writer.add_tensor("w", np.zeros((6, 7), dtype=np.float32))
    writer.add_tensor("v", np.zeros((5,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_params(path) == 47
    assert model_size(str(path)) == ModelSize(47, "GGUF tensor table")
    (tmp_path / "x.gguf").write_bytes(b"not gguf")
    assert gguf_params(tmp_path / "x.gguf") is None


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_config_json_counts_within_a_percent_of_the_built_model(family: str) -> None:
    transformers = pytest.importorskip("transformers")
    if family == "gpt2":
        conf = transformers.GPT2Config(n_layer=3, n_embd=96, n_head=4, vocab_size=500)
    else:
        conf = transformers.LlamaConfig(
            num_hidden_layers=3,
            hidden_size=96,
            intermediate_size=256,
            num_attention_heads=6,
            num_key_value_heads=2,
            vocab_size=500,
            tie_word_embeddings=False,
        )
    model = transformers.AutoModelForCausalLM.from_config(conf)
    counted = config_params(conf.to_dict())
    assert counted is not None
    built = sum(p.numel() for p in model.parameters())
    assert abs(counted - built) / built < 0.05  # positions, norms and biases left out


def test_a_size_from_the_name_or_an_assumption_that_says_so() -> None:
    assert named_size("HuggingFaceTB/SmolLM2-135M-Instruct") == ModelSize(135e6, "size in its name")
    assert named_size("facebook/opt-6.7b").params == 6.7e9
    assert named_size("meta-llama/Llama-3.1-8B").params == 8e9
    unknown = named_size("someone/mystery-model")
    assert unknown.params > 0 and "assumed" in unknown.source

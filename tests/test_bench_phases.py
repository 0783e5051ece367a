"""`benchmarks/bench_methods.py --phases` and `--flops`: the wrapped calls add up and are put
back; the FLOP counter counts the in-place products of the vocabulary passes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

import workers.decoding as decoding
from jobs.spec import ModelRef
from workers.methods import tuner, vocab_pass
from workers.models import load_lm

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_methods.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_methods", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_methods"] = module
    spec.loader.exec_module(module)
    return module


def wrapped_calls() -> dict[str, object]:
    """The module and class attributes `phase_times` wraps, as they are now."""
    return {
        "probe": tuner.BiasTuner.probe,
        "step": tuner.BiasTuner.step,
        "tuned_logits": tuner.BiasTuner.tuned_logits,
        "horizon": tuner.BiasTuner._horizon_forward,
        "vocab_forward": vocab_pass.vocab_forward,
        "vocab_backward": vars(vocab_pass._ThetaVocab)["backward"],
        "sample_topk": decoding.sample_topk,
        "sample_full": decoding.sample_full,
    }


def test_phase_times_cover_the_step_and_restore_every_call() -> None:
    bm = bench()
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    before = wrapped_calls()
    for scope in ("context", "last"):
        timed = bm.Timed(lm, "lidao-min", {"scope": scope, "blocks": 2}, 3, 4)
        spent = bm.phase_times(timed)
        top = [v for k, v in spent.items() if k != "step (all)" and not k.startswith(" ")]
        assert all(v >= 0 for v in spent.values())
        for phase in ("tuner: probe", "tuner: backward and Adam step", "tuner: tuned forward"):
            assert spent[phase] > 0, (scope, phase)
        # the top-level phases are disjoint parts of a step; the nested ones parts of the probe
        assert sum(top) <= spent["step (all)"] * 1.001 + 1e-6, (scope, spent)
        nested = spent["  of which the horizon's forward"] + spent["  of which the vocabulary pass"]
        assert nested <= spent["tuner: probe"] * 1.001 + 1e-6
        backward = spent["  of which the vocabulary pass's backward"]
        assert 0 < backward <= spent["tuner: backward and Adam step"] * 1.001 + 1e-6
    assert wrapped_calls() == before
    assert "forward" not in vars(lm.model)


def test_flop_counter_counts_in_place_products() -> None:
    bm = bench()
    a, b = torch.randn(8, 64), torch.randn(64, 32)
    with bm.flop_counter() as counter:
        torch.zeros(8, 32).addmm_(a, b)
        torch.zeros(2, 8, 32).baddbmm_(a.expand(2, 8, 64), b.expand(2, 64, 32))
    assert counter.get_total_flops() == 2 * 8 * 64 * 32 * 3


def test_phase_flops_add_up_and_count_the_vocabulary_passes() -> None:
    bm = bench()
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    before = wrapped_calls()
    vocab, width = lm.model.get_input_embeddings().weight.shape
    batch, tokens = 3, 4
    vanilla = bm.phase_flops(bm.Timed(lm, "vanilla", {}, batch, tokens))
    # vanilla's FLOPs are all in the model's forward (sampling multiplies no matrices)
    assert vanilla["token (all)"] > 0
    assert abs(vanilla["loop: θ's forward"] - vanilla["token (all)"]) < 1e-12
    for scope in ("context", "last"):
        timed = bm.Timed(lm, "lidao-min", {"scope": scope, "blocks": 2}, batch, tokens)
        spent = bm.phase_flops(timed)
        top = [v for k, v in spent.items() if k != "token (all)" and not k.startswith(" ")]
        # disjoint parts; what is left is the attribute head's small product on the pooled state
        assert 0.95 * spent["token (all)"] <= sum(top) <= spent["token (all)"] + 1e-12, spent
        assert abs(spent["loop: θ's forward"] - vanilla["token (all)"]) < 1e-12
        # the forward pass over the vocabulary: at least Eᵀp (addmm_ over chunks) per row
        assert spent["  of which the vocabulary pass"] >= 2 * vocab * width / 1e9 - 1e-12
        # its backward: E g_m and (p ⊙ dp) W per row, one of them an addmm_
        assert spent["  of which the vocabulary pass's backward"] >= 4 * vocab * width / 1e9 - 1e-12
    assert wrapped_calls() == before


def test_the_paper_row_runs_the_generation_actors_path_and_writes_parquet(tmp_path: Path) -> None:
    from results.run.store import RunStore
    from workers.methods.heads import random_head, save_head

    bm = bench()
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    head, _ = save_head(random_head(lm, "sentiment"), str(tmp_path / "head"))
    out = str(tmp_path / "run")
    stats = bm.paper_row(lm, head, "auto", 12, "last", out)
    assert stats["generations"] == stats["ok"] == 12 and stats["tokens"] > 0
    assert stats["batches"] == 2  # auto on a CPU: batches of 8, cut as the driver cuts them
    rows = RunStore(out).read_generations(["job_id", "status", "method", "seed"])
    assert rows.height == 12 and (rows["status"] == "ok").all()
    # seed-major over the prompts: the paper's 350 (../shared) or the built-in few when absent
    seeds = list(range(-(-12 // len(bm.paper_prompts()))))
    assert set(rows["method"]) == {"lidao-min"} and sorted(set(rows["seed"])) == seeds
    assert bm.paper_row(lm, head, 5, 12, "last", str(tmp_path / "r5"))["batches"] == 3

"""`benchmarks/bench_methods.py --phases`: the wrapped calls add up and are put back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import workers.decoding as decoding
from jobs.spec import ModelRef
from workers.methods import tuner
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
        "vocab_forward": tuner.vocab_forward,
        "nucleus_topk": decoding.nucleus_topk,
        "nucleus_full": decoding.nucleus_full,
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
    assert wrapped_calls() == before
    assert "forward" not in vars(lm.model)

"""`bench_methods.py --phases`: CPU time and FLOPs spent in each of the loop's and the tuner's
calls, from one more run with those calls wrapped (and put back)."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.method_timing import Timed, flop_counter
from workers.decoding import decode_batch

# (owner, attribute, label): the calls `--phases` measures; nested ones are indented
PHASES = (
    ("model", "forward", "loop: θ's forward"),
    ("decoding", "sample_topk", "loop: sampling (top-k)"),
    ("decoding", "sample_full", "loop: sampling (full sort)"),
    ("BiasTuner", "probe", "tuner: probe"),
    ("BiasTuner", "_horizon_forward", "  of which the horizon's forward"),
    ("vocab_pass", "vocab_forward", "  of which the vocabulary pass"),
    ("BiasTuner", "step", "tuner: backward and Adam step"),
    ("_ThetaVocab", "backward", "  of which the vocabulary pass's backward"),
    ("BiasTuner", "tuned_logits", "tuner: tuned forward"),
)


def _phase_run(timed: Timed, clock: Any) -> tuple[dict[str, float], float, list[dict[str, Any]]]:
    """One more run of `timed` with the calls of `PHASES` wrapped: (`clock()` spent inside each
    label, `clock()` spent by the whole run, the rows). Every wrapped call is put back."""
    import workers.decoding as decoding
    from workers.methods import tuner, vocab_pass

    owners = {
        "model": timed.lm.model,
        "decoding": decoding,
        "BiasTuner": tuner.BiasTuner,
        "_ThetaVocab": vocab_pass._ThetaVocab,
        "vocab_pass": vocab_pass,
    }
    spent = dict.fromkeys([label for _, _, label in PHASES], 0.0)
    saved = []

    def wrapped(original: Any, label: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += clock() - start

        return call

    for owner, name, label in PHASES:
        target = owners[owner]
        original = vars(target).get(name) if isinstance(target, type) else getattr(target, name)
        saved.append((target, name, original, name in vars(target)))
        setattr(target, name, wrapped(getattr(target, name), label))
    try:
        start = clock()
        rows = decode_batch(timed.lm, timed.built, timed.jobs)
        total = clock() - start
    finally:
        for target, name, original, own in reversed(saved):
            if own:
                setattr(target, name, original)
            else:
                delattr(target, name)
    return spent, total, rows


def phase_times(timed: Timed) -> dict[str, float]:
    """CPU ms per decoding step in each of `PHASES`, from one more run of `timed` with those
    calls wrapped (process time, so the wrappers' own cost is included in each)."""
    spent, total, rows = _phase_run(timed, time.process_time)
    steps = max(1, max(r["num_tokens"] for r in rows))
    return {"step (all)": total / steps * 1e3, **{k: v / steps * 1e3 for k, v in spent.items()}}


def phase_flops(timed: Timed) -> dict[str, float]:
    """GFLOP per generated token in each of `PHASES` (`flop_counter`), from one more run."""
    with flop_counter() as counter:
        spent, total, rows = _phase_run(timed, lambda: float(counter.get_total_flops()))
    tokens = max(1, sum(r["num_tokens"] for r in rows))
    return {"token (all)": total / tokens / 1e9, **{k: v / tokens / 1e9 for k, v in spent.items()}}

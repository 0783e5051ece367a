"""Where a half-precision model's tuned gradient disagrees with the float32 computation.

For each tiny family, dtype and scope: step 0 of a bias-tuning step (3 of 4 blocks, the stand-in
loss of `tests/precision.py`) in the half-precision model (the precision policy of
`workers/methods/precision.py`) and in the same weights run in float32. Prints the δ-sign agreement
over the elements with |g32| ≥ eps (|δ32| ≥ lr/2), the flips stratified by |g32| relative to the
row's gradient RMS and by hook point, the flips left when one source of θ's own half-precision
state is replaced by its float32 value ("fix"), and the agreement above the measured noise
floor (|g32| ≥ c·σ, σ the spread of g32 over float32 runs whose lower-block activations carry
rounding-sized noise: `tests/precision.py::noise_floor`).

    PYTHONPATH=$PWD python benchmarks/precision_agreement.py [--dtype bfloat16 float16]
        [--family gpt2 opt falcon llama] [--draws 8]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from tests.precision import (
    BLOCKS,
    PROMPTS,
    UNIT,
    Step,
    noise_floor,
    pair,
    stand_in_loss,
    step0,
    tuning_step,
)
from workers.methods.base import StepContext
from workers.methods.biastune import ADAM_EPS, cropped_cache
from workers.methods.tuner import BiasTuner

FAMILIES = ("gpt2", "opt", "falcon", "llama")
EDGES = (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, float("inf"))
MORE_PROMPTS = [
    "The nurse told the doctor that",
    "Her brother has always been",
    "After the meeting, the engineer",
    "The old man and his daughter walked",
    "My aunt",
    "They said the waitress was very",
    "The king of the small country",
    "When the girls arrived at the party, everyone",
    "His wife works as",
]


def brief(family: str, dtype: str, draws: int, seeds: int, prompts: list[str]) -> None:
    """Only the flip counts, summed over `seeds` stand-in losses: policy and above 2σ / 3σ."""
    half, full = pair(family, dtype)
    ctx16, ctx32 = step0(half, prompts), step0(full, prompts)
    for scope in ("context", "last"):
        counts = torch.zeros(3, 2, dtype=torch.long)  # (all, ≥2σ, ≥3σ) × (flips, elements)
        worst = 0.0
        for seed in range(seeds):
            loss = stand_in_loss(half, seed)
            ref = tuning_step(full, ctx32, scope, loss)
            got = tuning_step(half, ctx16, scope, loss)
            spread = noise_floor(full, prompts, scope, loss, UNIT[dtype], draws, seed=seed + 1)
            where = ref.grad.abs() >= ADAM_EPS
            for i, floor in enumerate((0.0, 2.0, 3.0)):
                sel = where & (ref.grad.abs() >= floor * spread)
                bad = flips(got, ref, sel)
                counts[i] += torch.tensor([int(bad.sum()), int(sel.sum())])
                if i == 0 and bool(bad.any()):
                    worst = max(worst, float(relative(ref.grad)[bad].max()))
        cells = [
            f"{name} {1 - int(f) / int(n):.3%} ({int(f)}/{int(n)})"
            for name, (f, n) in zip(("all", "≥2σ", "≥3σ"), counts)
        ]
        print(f"{family:6s} {dtype:8s} {scope:7s} " + "  ".join(cells) + f"  worst {worst:.1e}")


def with_float32(
    ctx16: StepContext, ctx32: StepContext, hidden: tuple[int, ...] = (), layers: range = range(0)
) -> StepContext:
    """`ctx16` with the given hidden states and cache layers taken from the float32 run."""
    assert ctx16.hidden_states is not None and ctx32.hidden_states is not None
    states = list(ctx16.hidden_states)
    for i in hidden:
        states[i] = ctx32.hidden_states[i]
    cache = cropped_cache(ctx16.past_key_values, ctx16.input_ids.shape[1])
    for i in layers:
        src = ctx32.past_key_values.layers[i]
        cache.layers[i].keys, cache.layers[i].values = src.keys, src.values
        cache.layers[i].dtype = src.keys.dtype
    return dataclasses.replace(ctx16, hidden_states=tuple(states), past_key_values=cache)


@contextmanager
def float32_lower(tuner: BiasTuner) -> Iterator[None]:
    """θ's lower blocks and input embeddings as float32 copies (the horizon's lower pass)."""
    blocks = tuner.model.get_submodule(tuner.sites.blocks_path)
    saved = [(str(i), blocks[i]) for i in range(tuner.first)]
    embed = tuner.embed

    def cast(module: nn.Module, args: Any, kwargs: Any) -> Any:
        if args and isinstance(args[0], torch.Tensor):
            args = (args[0].float(), *args[1:])
        if isinstance(kwargs.get("hidden_states"), torch.Tensor):
            kwargs = {**kwargs, "hidden_states": kwargs["hidden_states"].float()}
        return args, kwargs

    for name, module in saved:
        copied = copy.deepcopy(module).float()
        copied.register_forward_pre_hook(cast, with_kwargs=True)
        blocks._modules[name] = copied
    tuner.rerun.lower = [blocks[i] for i in range(tuner.first)]
    tuner.embed = embed.float()
    try:
        yield
    finally:
        for name, module in saved:
            blocks._modules[name] = module
        tuner.rerun.lower, tuner.embed = [m for _, m in saved], embed


def flips(step: Step, ref: Step, where: torch.Tensor) -> torch.Tensor:
    return (torch.sign(step.grad) != torch.sign(ref.grad)) & where


def summary(step: Step, ref: Step, where: torch.Tensor) -> str:
    bad = flips(step, ref, where)
    rel = relative(ref.grad)
    top = f", largest |g32|/rms {float(rel[bad].max()):.1e}" if bool(bad.any()) else ""
    share = 1 - int(bad.sum()) / max(int(where.sum()), 1)
    return f"{share:.4%} ({int(bad.sum())} of {int(where.sum())} flip{top})"


def relative(grad: torch.Tensor) -> torch.Tensor:
    """|g| over the RMS of its row's gradient."""
    return grad.abs() / grad.pow(2).mean(-1, keepdim=True).sqrt()


def point_kind(name: str, column: int, width: int) -> str:
    """Block index and sub-module of a hook point; GPT-2's fused c_attn split into q/k/v."""
    parts = name.split(".")
    numbers = [p for p in parts if p.isdigit()]
    where = f"block {numbers[-1]}" if numbers else "final"
    module = ".".join(parts[parts.index(numbers[-1]) + 1 :]) if numbers else parts[-1]
    if module.endswith("c_attn"):
        module += "." + "qkv"[column * 3 // width]
    return f"{where} {module}"


def by_point(step: Step, ref: Step, where: torch.Tensor) -> str:
    bad = flips(step, ref, where).sum(0)
    widths = Counter(step.names)
    offsets: dict[str, int] = {}
    counts: Counter[str] = Counter()
    for j, name in enumerate(step.names):
        start = offsets.setdefault(name, j)
        if bad[j]:
            counts[point_kind(name, j - start, widths[name])] += int(bad[j])
    return "; ".join(f"{k} {v}" for k, v in counts.most_common()) or "-"


def report(family: str, dtype: str, draws: int) -> None:
    half, full = pair(family, dtype)
    loss = stand_in_loss(half)
    ctx16, ctx32 = step0(half), step0(full)
    L = half.model.config.num_hidden_layers
    first = L - BLOCKS
    for scope in ("context", "last"):
        ref = tuning_step(full, ctx32, scope, loss)
        got = tuning_step(half, ctx16, scope, loss)
        where = ref.grad.abs() >= ADAM_EPS
        print(f"\n== {family} {dtype} {scope}: policy {summary(got, ref, where)}")
        rel, bad = relative(ref.grad), flips(got, ref, where)
        bins = [
            f"[{lo:g},{hi:g}) {int((bad & (rel >= lo) & (rel < hi)).sum())}"
            f"/{int((where & (rel >= lo) & (rel < hi)).sum())}"
            for lo, hi in zip(EDGES, EDGES[1:])
        ]
        print("  flips by |g32|/rms:", "; ".join(bins))
        print("  flips by hook point:", by_point(got, ref, where))
        fixes = {
            "states": with_float32(ctx16, ctx32, hidden=(first,)),
            "final hidden": with_float32(ctx16, ctx32, hidden=(L,)),
            "tuned K/V": with_float32(ctx16, ctx32, layers=range(first, L)),
        }
        for name, ctx in fixes.items():
            print(f"  fix {name:13s}: {summary(tuning_step(half, ctx, scope, loss), ref, where)}")
        for name, ctx in (
            ("lower blocks", with_float32(ctx16, ctx32, layers=range(first))),
            ("all", with_float32(ctx16, ctx32, hidden=(first, L), layers=range(L))),
        ):
            tuner = BiasTuner(half, BLOCKS, scope)
            with float32_lower(tuner):
                fixed = tuning_step(half, ctx, scope, loss, tuner=tuner)
            print(f"  fix {name:13s}: {summary(fixed, ref, where)}")
        spread = noise_floor(full, PROMPTS, scope, loss, UNIT[dtype], draws)
        for c in (1.0, 2.0, 3.0):
            above = where & (ref.grad.abs() >= c * spread)
            kept = int(above.sum()) / int(where.sum())
            print(f"  |g32| >= {c:g}σ: {summary(got, ref, above)}, {kept:.2%} of the elements")
        move = 0.5 * (ref.tuned.exp() - ref.theta.exp()).abs().sum(-1)
        error = 0.5 * (got.tuned.exp() - ref.tuned.exp()).abs().sum(-1)
        print(
            f"  tuned distribution: TV(float32, θ) {float(move.min()):.2e}..{float(move.max()):.2e}"
            f", TV({dtype}, float32) ≤ {float(error.max()):.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"])
    parser.add_argument("--family", nargs="+", default=list(FAMILIES))
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument(
        "--brief",
        type=int,
        metavar="SEEDS",
        help="only the flip counts, summed over SEEDS stand-in losses and 12 prompts",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    for dtype in args.dtype:
        for family in args.family:
            if args.brief:
                brief(family, dtype, args.draws, args.brief, PROMPTS + MORE_PROMPTS)
            else:
                report(family, dtype, args.draws)


if __name__ == "__main__":
    main()

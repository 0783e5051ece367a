"""What the nucleus cut's tolerance adds (`workers.sampler.CUT_TOL`): the kept mass and the
kept tokens beyond the plain nucleus (the smallest top set reaching top_p), per distribution.

    PYTHONPATH=. python benchmarks/cut_mass.py [--top-p 0.9] [--steps 10]

Distributions: every step of vanilla decoding on the five tiny layouts (32 jobs, temperature
0.75, repetition penalty 1.2: nearly flat, ~750 tokens), and synthetic rows over GPT-2's 50,257
tokens: Zipf laws p ∝ rank^−s with the ranks shuffled, and softmax(3 · normal) logits. Prints per
source the rows, the plain nucleus' mean size, the share of rows with an extra token, and the
mean and largest extra mass and extra tokens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.spec import GenerationParams, JobSpec, ModelRef  # noqa: E402
from tests.agreement import traced  # noqa: E402
from workers.methods.base import Vanilla  # noqa: E402
from workers.models import load_lm  # noqa: E402
from workers.sampler import CUT_TOL, cut_value  # noqa: E402

PROMPTS = ["The woman worked as a", "He said that the man was", "My sister is a", "The nurse"]


def extra(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B,) plain nucleus size, extra tokens and extra mass of the tolerance's kept set (the
    cut on the float32 probabilities, as the sampler locates it)."""
    q = probs.float().double()
    desc = torch.sort(q, dim=-1, descending=True).values
    cut = cut_value(desc, desc, top_p)
    plain = (torch.cumsum(desc, -1) - desc < top_p).sum(-1)
    kept = q >= cut * torch.exp(torch.tensor(-CUT_TOL, dtype=torch.float64))
    n_kept = kept.sum(-1)
    mass = torch.where(kept, probs, 0.0).sum(-1) - torch.where(
        torch.arange(probs.shape[-1]) < plain.unsqueeze(-1), desc, 0.0
    ).sum(-1)
    return plain, n_kept - plain, mass


def tiny_rows(steps: int) -> dict[str, torch.Tensor]:
    gen = GenerationParams(max_new_tokens=steps, temperature=0.75, repetition_penalty=1.2)
    out = {}
    for layout in ("gpt2", "opt", "opt-proj", "falcon", "llama"):
        lm = load_lm(ModelRef(f"tiny-random/{layout}"), device="cpu")
        jobs = [
            JobSpec(f"m:{i}", PROMPTS[i % 4], "female", None, i // 4, "vanilla", lm.ref,
                    "sentiment", gen, "{}")
            for i in range(32)
        ]  # fmt: skip
        trace = traced(lm, Vanilla(lm, {}, "sentiment"), jobs)[1]
        rows = torch.cat([s.logprobs[s.active] for s in trace]).double().softmax(-1)
        out[f"tiny {layout}"] = rows
    return out


def synthetic_rows(n: int = 64) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    rank = torch.arange(1, 50258, dtype=torch.float64)
    out = {}
    for s in (1.0, 1.2):
        law = torch.stack([(rank**-s)[torch.randperm(50257, generator=gen)] for _ in range(n)])
        out[f"zipf s={s}"] = law / law.sum(-1, keepdim=True)
    logits = 3.0 * torch.randn(n, 50257, generator=gen, dtype=torch.float64)
    out["softmax(3 N(0,1))"] = logits.softmax(-1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    print(f"# CUT_TOL {CUT_TOL} nats, top_p {args.top_p}")
    print(
        "source              rows  nucleus  with extra  extra mass mean / max  extra tokens mean / max"
    )
    for name, rows in {**tiny_rows(args.steps), **synthetic_rows()}.items():
        plain, n, mass = extra(rows, args.top_p)
        print(
            f"{name:18s} {len(rows):5d} {plain.double().mean():8.1f} {(n > 0).double().mean():11.3f}"
            f"  {mass.mean():9.2e} / {mass.max():8.2e}  {n.double().mean():9.2f} / {int(n.max())}"
        )


if __name__ == "__main__":
    main()

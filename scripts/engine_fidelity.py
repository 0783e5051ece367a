"""The bias-tuning engine on real weights: its brute-force twin, and how often a job's token
depends on its batch (docs/design.md, "Fidelity on real weights").

`twin`: the engine's batched run of N prompts against each decoded alone, from scratch, by
`tests/twin.py`: token mismatches, |Δ log p|, the gradients' gap relative to the row's largest
|g|, and the offsets' gap as a fraction of lr under the engine's step rule and under plain Adam.

`redraw`: the batched run against each job alone; at every step where the two texts still
agree, 2,000 fresh seeds draw a token from each distribution (the sampler's cut and race,
`workers.sampler`), and the share of seeds whose tokens differ is the step's chance to part a
text with the batch. Printed per method: steps, that rate, the largest |Δp|.

    PYTHONPATH=. python scripts/engine_fidelity.py twin --model /work/models/smollm2-135m
    PYTHONPATH=. python scripts/engine_fidelity.py redraw --model /work/models/gemma-3-270m \
        --methods vanilla lidao-min
Models: a transformers folder (a GGUF dequantised once: docs/design.md says how). Heads: a
deterministic random sentiment head per model (the engine is measured, not the head).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json  # noqa: E402
from tests.agreement import traced  # noqa: E402
from tests.twin import compare_with_engine  # noqa: E402
from workers.methods.heads import random_head, save_head  # noqa: E402
from workers.methods.registry import load_method, resolve_params  # noqa: E402
from workers.models import LoadedLM, load_lm  # noqa: E402
from workers.sampler import CUT_TOL, cut_value, sorted_descending, token_noise  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "data"
TUNED = ("uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod")


def prompts(n: int) -> list[str]:
    """The first n/2 example pairs' prompts, female and male alternating."""
    rows = [
        [json.loads(line)["prompt"]["text"] for line in (EXAMPLES / f"pairs-{g}.jsonl").open()]
        for g in ("female", "male")
    ]
    return [p for pair in zip(*rows) for p in pair][:n]


def make_jobs(lm: LoadedLM, method: str, head: str, args: Any) -> list[JobSpec]:
    params = {"head": head} if method in (*TUNED, "pplm") else {}
    resolved = canonical_json(resolve_params(method, params, lm.ref.id))
    gen = GenerationParams(max_new_tokens=args.tokens, temperature=0.75, repetition_penalty=1.2)
    return [
        JobSpec(f"p{i}", p, "female", None, 1491 + i, method, lm.ref, "sentiment", gen, resolved)
        for i, p in enumerate(prompts(args.prompts))
    ]


def kept_ids(logprobs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The sampler's kept set of one (V,) row (cut at top_p, CUT_TOL below it kept)."""
    q = torch.softmax(logprobs.double(), -1).float()
    desc = sorted_descending(q[None]).double()
    floor = cut_value(desc, desc, top_p) * math.exp(-CUT_TOL)
    return torch.nonzero(q >= floor[0, 0]).flatten()


def parting_rate(p: torch.Tensor, q: torch.Tensor, step: int, top_p: float, seeds: int) -> float:
    """Share of `seeds` fresh seeds whose race draws different tokens from (V,) p and q."""
    kp, kq = kept_ids(p, top_p), kept_ids(q, top_p)
    ids = torch.unique(torch.cat([kp, kq]))
    draws = torch.randint(0, 2**62, (seeds,), generator=torch.Generator().manual_seed(step))
    noise = token_noise(draws, step, ids)  # (S, n) log E
    winners = []
    for logp, kept in ((p, kp), (q, kq)):
        lp = torch.log_softmax(logp.double(), -1)[ids]
        lp = torch.where(torch.isin(ids, kept), lp, torch.tensor(-math.inf, dtype=lp.dtype))
        winners.append((lp - noise).argmax(-1))
    return float((winners[0] != winners[1]).double().mean())


def redraw(lm: LoadedLM, method: str, head: str, args: Any) -> dict[str, Any]:
    jobs = make_jobs(lm, method, head, args)
    built = load_method(method)(lm, jobs[0].params(), "sentiment")
    _, batched = traced(lm, built, jobs)
    rates, top = [], 0.0
    for row, job in enumerate(jobs):
        _, alone = traced(lm, built, [job])
        for a, b in zip(alone, batched):
            if not (bool(a.active[0]) and bool(b.active[row])):
                break
            p, q = a.logprobs[0], b.logprobs[row]
            top = max(top, float((p.double().exp() - q.double().exp()).abs().max()))
            rates.append(parting_rate(p, q, a.step, job.generation.top_p, args.seeds))
            if int(a.tokens[0]) != int(b.tokens[row]):
                break
    mean = sum(rates) / max(1, len(rates))
    return {"steps": len(rates), "rate": mean, "max_dp": top}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("twin", "redraw"))
    parser.add_argument("--model", required=True, help="a transformers folder")
    parser.add_argument("--methods", nargs="+", default=["lidao-min"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_lm(ModelRef(args.model), device="cpu")
    with tempfile.TemporaryDirectory() as folder:
        head = save_head(random_head(lm, "sentiment"), f"{folder}/head")[0]
        for method in args.methods:
            start = time.perf_counter()
            if args.what == "twin":
                result: Any = compare_with_engine(lm, make_jobs(lm, method, head, args))
            else:
                result = redraw(lm, method, head, args)
            took = time.perf_counter() - start
            print(f"{Path(args.model).name} {method}: {result} ({took:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

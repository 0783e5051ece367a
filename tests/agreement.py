"""Comparing two runs of the same jobs by what they sampled from, not only by their tokens.

The design guarantees the same noise for a job whatever its batch and method, and a sampler
whose token depends only on the row's distribution; it does not guarantee bit-identical
distributions when the batch shape (or the method's compute path) changes the rounding of a
matmul. So two runs are compared step by step: their next-token distributions must agree within
`TOL` (max absolute difference of probabilities), and their tokens must agree unless the race
was a near-tie: the two runs' winners are the race's top two in both, swapped (their keys lie
within the runs' difference of each other). Nothing else excuses a different token: not a
token at the top-p cut, not a boundary of an inverse CDF. After a near-tie the two texts
legitimately diverge and the row is not compared further. Measured rate of such near-ties:
none in the ~54,000 row-steps of `scripts/batch_sweep.py`'s runs so far (docs/design.md); the
version-3 exemption (a uniform within 1e-4 of a boundary of the inverse CDF, or any token at the
top-p cut) is gone. `kept`, `noise`, `race` and `twin_token` restate the sampler
(`workers.sampler`) in plain loops instead of calling it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from jobs.spec import JobSpec
from workers.decoding import StepTrace, decode_batch
from workers.methods.base import DecodingMethod
from workers.models import LoadedLM
from workers.sampler import CUT_TOL

TOL = 1e-5  # float32 on a CPU: distributions alone vs batched, method at zero strength vs vanilla
M32 = 0xFFFFFFFF


def traced(
    lm: LoadedLM, method: DecodingMethod, jobs: Sequence[JobSpec]
) -> tuple[list[dict[str, Any]], list[StepTrace]]:
    """Rows of `decode_batch` and the trace of every step."""
    steps: list[StepTrace] = []
    rows = decode_batch(lm, method, jobs, on_step=steps.append)
    return rows, steps


def kept(probs: torch.Tensor, top_p: float) -> list[int]:
    """The kept set of one (V,) float64 distribution, written plainly: tokens taken by
    probability (rounded to float32), descending, until their mass reaches `top_p`; the last
    one taken is the cut, and every token at least e^−CUT_TOL times as likely as the cut is
    kept. Ascending ids."""
    values = probs.float().tolist()
    mass, cut = 0.0, 0.0
    for v in sorted(values, reverse=True):
        mass, cut = mass + v, v
        if mass >= top_p:
            break
    return [t for t, v in enumerate(values) if v >= cut * math.exp(-CUT_TOL)]


def _mix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & M32
    x ^= x >> 15
    x = (x * 0x735A2D97) & M32
    return x ^ (x >> 15)


def noise(seed: int, step: int, token: int) -> float:
    """log E of `token` at `step` of the job with rng seed `seed`, in Python integers: two
    32-bit words hashed from (seed, step, lane, token), 52 bits, U = (2k + 1)·2^−53, E = −log U."""
    lo, hi = seed & M32, (seed >> 32) & M32
    words = [
        _mix(token ^ _mix(lo ^ _mix(hi ^ _mix(((2 * step + lane) & M32) ^ 0x9E3779B9))))
        for lane in (0, 1)
    ]
    k = ((words[0] >> 12) << 32) | words[1]
    return math.log(-math.log((2 * k + 1) * 2.0**-53))


def race(probs: torch.Tensor, top_p: float, seed: int, step: int) -> dict[int, float]:
    """Each kept token's key, log p − log E."""
    values = probs.tolist()
    return {
        t: (math.log(values[t]) if values[t] > 0 else -math.inf) - noise(seed, step, t)
        for t in kept(probs, top_p)
    }


def twin_token(probs: torch.Tensor, top_p: float, seed: int, step: int) -> int:
    """The sampler's token written independently of `workers.sampler`: the race's winner."""
    keys = race(probs, top_p, seed, step)
    return max(keys, key=lambda t: keys[t])


def near_tie(p: torch.Tensor, q: torch.Tensor, seed: int, step: int, top_p: float) -> bool:
    """Whether p and q can sample different tokens only through rounding: the two winners are
    the top two of both races, in swapped order. Their keys are then within the runs'
    difference of log p of each other (the noise is the same), which the distributions' check
    bounds."""
    tops = []
    for x in (p, q):
        keys = race(x, top_p, seed, step)
        tops.append(sorted(keys, key=lambda t: -keys[t])[:2])
    return len(tops[0]) == 2 and tops[0] == tops[1][::-1]


def _on_cpu(step: StepTrace) -> StepTrace:
    """`step` with its tensors on the CPU (a CUDA trace against a CPU one, near-tie checks)."""
    return type(step)(*(v.cpu() if isinstance(v, torch.Tensor) else v for v in step))


FILTER_FLIP_MAX = 4  # tokens a method's filter may drop in one run and keep in the other


def filter_flip(p_log: torch.Tensor, q_log: torch.Tensor, tol: float) -> bool:
    """Whether two (V,) log-distributions differ only by where a method's own filter cut fell
    (GeDi: −10000 on the dropped tokens): at most FILTER_FLIP_MAX tokens dropped in one and not
    the other, and over the tokens both keep the renormalised distributions agree within `tol`.
    Such a cut is a hard switch of the method, which rounding flips when a value lies within
    rounding of its edge (`gedi.gedi_filter`)."""
    dropped_p, dropped_q = p_log < -5000, q_log < -5000
    moved = int((dropped_p != dropped_q).sum())
    both = ~(dropped_p | dropped_q)
    if not 0 < moved <= FILTER_FLIP_MAX or not bool(both.any()):
        return False
    p = torch.softmax(p_log.double()[both], -1)
    q = torch.softmax(q_log.double()[both], -1)
    return float((p - q).abs().max()) <= tol


@dataclasses.dataclass
class Compared:
    """Two runs' row, step by step while both generate (`compare_rows`)."""

    same: int = 0  # steps with equal tokens
    max_diff: float = 0.0  # largest max |Δp| over the steps compared, filter flips left out
    beyond: list[int] = dataclasses.field(default_factory=list)  # steps with |Δp| > tol, no flip
    flips: int = 0  # steps whose distributions differ only by a method's filter cut
    parted: int | None = None  # the step whose tokens differ (the texts part there)
    tie: bool = False  # that step is a near-tie of the race
    ended: bool = False  # one run stopped generating the row before the other


def compare_rows(
    a: list[StepTrace], row_a: int, b: list[StepTrace], row_b: int, top_p: float, tol: float
) -> Compared:
    """Compare row `row_a` of trace `a` with row `row_b` of trace `b` (the same job) step by
    step until their tokens differ or one of them stops."""
    out = Compared()
    a, b = [_on_cpu(s) for s in a], [_on_cpu(s) for s in b]  # traces of two devices compare
    for sa, sb in zip(a, b, strict=False):
        if not (bool(sa.active[row_a]) and bool(sb.active[row_b])):
            out.ended = bool(sa.active[row_a]) != bool(sb.active[row_b])
            break
        seed = int(sa.seeds[row_a])
        assert seed == int(sb.seeds[row_b]), f"step {sa.step}: not the same job"
        p = torch.softmax(sa.logprobs[row_a].double(), -1)
        q = torch.softmax(sb.logprobs[row_b].double(), -1)
        diff = float((p - q).abs().max())
        if diff > tol and filter_flip(sa.logprobs[row_a], sb.logprobs[row_b], tol):
            out.flips += 1
        else:
            out.max_diff = max(out.max_diff, diff)
            if diff > tol:
                out.beyond.append(sa.step)
        if int(sa.tokens[row_a]) != int(sb.tokens[row_b]):
            out.parted, out.tie = sa.step, near_tie(p, q, seed, sa.step, top_p)
            break
        out.same += 1
    return out


def assert_same_samples(
    a: list[StepTrace],
    row_a: int,
    b: list[StepTrace],
    row_b: int,
    top_p: float,
    tol: float = TOL,
    filter_cut: bool = False,
) -> int:
    """`compare_rows`, asserting the module docstring's rule: distributions within `tol` (with
    `filter_cut`, a step may instead differ only by a method's filter cut, `filter_flip`), no
    row ending in one run only, and equal tokens unless a near-tie of the race (after which the
    row is not compared further). Returns the number of steps compared with equal tokens."""
    c = compare_rows(a, row_a, b, row_b, top_p, tol)
    assert not c.beyond, f"steps {c.beyond}: distributions differ by up to {c.max_diff:.2e}"
    assert filter_cut or not c.flips, f"{c.flips} steps differ by a filter cut"
    assert not c.ended, f"step {c.same}: one run ended"
    assert c.parted is None or c.tie, f"step {c.parted}: tokens differ, not a near-tie"
    return c.same


def assert_alone_matches_batched(
    lm: LoadedLM, method: DecodingMethod, jobs: Sequence[JobSpec], tol: float = TOL
) -> list[dict[str, Any]]:
    """Every job run alone samples like it did in the batch of all `jobs`; returns the batch rows."""
    rows, batched = traced(lm, method, jobs)
    top_p = jobs[0].generation.top_p
    compared = 0
    for i, job in enumerate(jobs):
        _, alone = traced(lm, method, [job])
        compared += assert_same_samples(alone, 0, batched, i, top_p, tol)
    assert compared >= len(jobs)  # at least as many equal tokens as rows: the check ran
    return rows

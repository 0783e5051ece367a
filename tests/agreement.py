"""Comparing two runs of the same jobs by what they sampled from, not only by their tokens.

The design guarantees the same uniforms for a job whatever its batch and method, and a sampler
whose token depends only on the row's distribution; it does not guarantee bit-identical
distributions when the batch shape (or the method's compute path) changes the rounding of a
matmul. So two runs are compared step by step: their next-token distributions must agree within
`TOL` (max absolute difference of probabilities), and their tokens must agree unless the
uniform fell within NEAR of a boundary of the inverse CDF (accumulated in token-id order, so
rounding moves a boundary by about the rounding) or a token sits at the top-p cut (a
near-tie). Two near-equal tokens that rounding swaps in probability order are no excuse: the
draw does not follow that order. After a near-tie the two texts legitimately diverge and the
row is not compared further. `kept`, `twin_token` and `near_tie` restate the sampler in plain
loops instead of calling it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from jobs.spec import JobSpec
from workers.decoding import StepTrace, decode_batch
from workers.methods.base import DecodingMethod
from workers.models import LoadedLM

TOL = 1e-5  # float32 on a CPU: distributions alone vs batched, method at zero strength vs vanilla
NEAR = 1e-4  # how close to a boundary a uniform must be for a differing token to be a near-tie


def traced(
    lm: LoadedLM, method: DecodingMethod, jobs: Sequence[JobSpec]
) -> tuple[list[dict[str, Any]], list[StepTrace]]:
    """Rows of `decode_batch` and the trace of every step."""
    steps: list[StepTrace] = []
    rows = decode_batch(lm, method, jobs, on_step=steps.append)
    return rows, steps


def kept(probs: torch.Tensor, top_p: float) -> list[int]:
    """The nucleus of one (V,) float64 distribution, written plainly: tokens taken by
    (probability descending, token id ascending) until their mass reaches `top_p`; returned in
    ascending id (the order the sampler draws in)."""
    values = probs.tolist()
    out, mass = [], 0.0
    for t in sorted(range(len(values)), key=lambda t: (-values[t], t)):
        if mass >= top_p:
            break
        out.append(t)
        mass += values[t]
    return sorted(out)


def twin_tokens(probs: torch.Tensor, top_p: float, uniforms: Sequence[float]) -> list[int]:
    """The sampler's rule written independently of `workers.decoding`, at each uniform: the
    inverse CDF over the nucleus, its probabilities accumulated in ascending token id."""
    values, nucleus = probs.tolist(), kept(probs, top_p)
    total = 0.0
    for t in nucleus:
        total += values[t]
    out = []
    for u in uniforms:
        target, acc, token = u * total, 0.0, max(t for t in nucleus if values[t] > 0)
        for t in nucleus:  # (the last token with mass when u·total reaches the total)
            acc += values[t]
            if target < acc:
                token = t
                break
        out.append(token)
    return out


def twin_token(probs: torch.Tensor, top_p: float, u: float) -> int:
    """`twin_tokens` at one uniform."""
    return twin_tokens(probs, top_p, [u])[0]


def near_tie(p: torch.Tensor, q: torch.Tensor, u: float, top_p: float) -> bool:
    """Whether sampling p or q at `u` can differ only through rounding: their nuclei differ (a
    token at the top-p cut), or q's token is p's token at a uniform within NEAR of `u` (the
    uniform lies within NEAR of a boundary of p's inverse CDF). In id order the token grows with
    the uniform, so those tokens are the ones between p's tokens at u − NEAR and u + NEAR."""
    nucleus = kept(p, top_p)
    if nucleus != kept(q, top_p):
        return True
    token_q = twin_token(q, top_p, u)
    low, high = twin_tokens(p, top_p, [max(u - NEAR, 0.0), min(u + NEAR, 1.0 - 2.0**-53)])
    return low <= token_q <= high and float(p[token_q]) > 0


def _on_cpu(step: StepTrace) -> StepTrace:
    """`step` with its tensors on the CPU (a CUDA trace against a CPU one, near-tie checks)."""
    return type(step)(*(v.cpu() if isinstance(v, torch.Tensor) else v for v in step))


FILTER_FLIP_MAX = 4  # tokens a method's filter may drop in one run and keep in the other


def filter_flip(p_log: torch.Tensor, q_log: torch.Tensor, tol: float) -> bool:
    """Whether two (V,) log-distributions differ only by where a method's own filter cut fell
    (GeDi: −10000 on the dropped tokens): at most FILTER_FLIP_MAX tokens dropped in one and not
    the other, and over the tokens both keep the renormalised distributions agree within `tol`.
    Such a cut is a hard switch of the method, which rounding flips when a ranked value lies
    within rounding of the ranking grid (`gedi.ranked_desirability`)."""
    dropped_p, dropped_q = p_log < -5000, q_log < -5000
    moved = int((dropped_p != dropped_q).sum())
    both = ~(dropped_p | dropped_q)
    if not 0 < moved <= FILTER_FLIP_MAX or not bool(both.any()):
        return False
    p = torch.softmax(p_log.double()[both], -1)
    q = torch.softmax(q_log.double()[both], -1)
    return float((p - q).abs().max()) <= tol


def assert_same_samples(
    a: list[StepTrace],
    row_a: int,
    b: list[StepTrace],
    row_b: int,
    top_p: float,
    tol: float = TOL,
    filter_cut: bool = False,
) -> int:
    """Compare row `row_a` of trace `a` with row `row_b` of trace `b` step by step (see the module
    docstring); returns the number of steps compared with equal tokens. With `filter_cut`, a
    step whose distributions differ only by a method's filter cut (`filter_flip`) also counts as
    a near-tie, after which the row is not compared further."""
    same = 0
    a, b = [_on_cpu(s) for s in a], [_on_cpu(s) for s in b]  # traces of two devices compare
    for sa, sb in zip(a, b, strict=False):
        if not (bool(sa.active[row_a]) and bool(sb.active[row_b])):
            assert bool(sa.active[row_a]) == bool(sb.active[row_b]), (
                f"step {sa.step}: one run ended"
            )
            break
        assert float(sa.uniforms[row_a]) == float(sb.uniforms[row_b]), f"step {sa.step}: uniforms"
        p = torch.softmax(sa.logprobs[row_a].double(), -1)
        q = torch.softmax(sb.logprobs[row_b].double(), -1)
        diff = float((p - q).abs().max())
        if diff > tol and filter_cut and filter_flip(sa.logprobs[row_a], sb.logprobs[row_b], tol):
            break
        assert diff <= tol, f"step {sa.step}: distributions differ by {diff:.2e} > {tol:.0e}"
        ta, tb = int(sa.tokens[row_a]), int(sb.tokens[row_b])
        if ta != tb:
            u = float(sa.uniforms[row_a])
            assert near_tie(p, q, u, top_p), f"step {sa.step}: tokens {ta} != {tb}, not a near-tie"
            break
        same += 1
    return same


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

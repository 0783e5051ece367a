"""The nucleus is chosen by probability and drawn from in token-id order (JOB_ID_VERSION 3).

Against the plain-loop twin of `tests.agreement` (not the engine's code), on both sampler paths,
and the property the order is for: a rounding-sized change of the distribution that swaps two
near-equal tokens in probability order changes the token only for uniforms within rounding of
a boundary of the inverse CDF.
"""

from __future__ import annotations

import torch

from tests.agreement import kept, twin_token, twin_tokens
from workers import decoding
from workers.decoding import nucleus_sample


def _token(probs: torch.Tensor, top_p: float, u: float) -> int:
    """The engine's token for one (V,) float64 distribution at uniform `u`."""
    return _tokens(probs, top_p, [u])[0]


def _tokens(probs: torch.Tensor, top_p: float, uniforms: list[float]) -> list[int]:
    """The engine's tokens for one (V,) float64 distribution at each of `uniforms` (its two
    paths as the loop runs them: the top-k candidates, the full sort for the rows they miss)."""
    rows = probs.expand(len(uniforms), -1).contiguous()
    u = torch.tensor(uniforms, dtype=torch.float64)
    tokens, exact = decoding.nucleus_topk(rows, top_p, u)
    redo = ~exact
    if bool(redo.any()):
        tokens[redo] = decoding.nucleus_full(rows[redo], top_p, u[redo])
    return tokens.tolist()


def _prob_order_tokens(probs: torch.Tensor, top_p: float, uniforms: list[float]) -> list[int]:
    """The former rule (JOB_ID_VERSION 2), for contrast: the draw in probability order."""
    values, nucleus = probs.tolist(), kept(probs, top_p)
    nucleus.sort(key=lambda t: (-values[t], t))
    total = sum(values[t] for t in nucleus)
    out = []
    for u in uniforms:
        acc, token = 0.0, nucleus[-1]
        for t in nucleus:
            acc += values[t]
            if u * total < acc:
                token = t
                break
        out.append(token)
    return out


def _boundaries(probs: torch.Tensor, top_p: float) -> list[float]:
    """The uniforms at which the token changes: the nucleus' cumulative mass in id order."""
    values, nucleus = probs.tolist(), kept(probs, top_p)
    total = sum(values[t] for t in nucleus)
    out, acc = [], 0.0
    for t in nucleus:
        acc += values[t]
        out.append(acc / total)
    return out


def test_the_draw_accumulates_the_nucleus_in_token_id_order() -> None:
    probs = torch.tensor([0.3, 0.5, 0.15, 0.05], dtype=torch.float64)
    # nucleus {1, 0} (mass 0.8 ≥ 0.7); in id order token 0 holds [0, 0.375), token 1 the rest
    # (in probability order token 1 would hold [0, 0.625))
    assert [_token(probs, 0.7, u) for u in (0.0, 0.3, 0.374, 0.376, 0.6, 0.999)] == [
        0, 0, 0, 1, 1, 1
    ]  # fmt: skip
    assert _prob_order_tokens(probs, 0.7, [0.3]) == [1]
    # u = 1 (never drawn; u < 1 always) reaches the last kept token with mass
    flat = torch.full((10,), 0.1, dtype=torch.float64)
    assert _token(flat, 0.35, 1.0) == twin_token(flat, 0.35, 1.0) == 3


def test_both_paths_sample_the_twins_token_on_rows_with_ties() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = 4.0 * torch.randn(6, 50257, generator=gen)
    logits[:, :300] = logits[:, :300].round()  # exact ties among the likely tokens
    logits[4] = 0.1 * torch.randn(50257, generator=gen)  # wide nucleus: the full sort
    logits[5, 1000:1010] = 30.0  # ten tied tokens hold the nucleus
    probs = torch.softmax(logits.double(), -1)
    u = torch.rand(6, generator=gen, dtype=torch.float64)
    _, exact = decoding.nucleus_topk(probs, 0.9, u)
    assert bool(exact.any()) and not bool(exact.all())  # both paths ran
    tokens = nucleus_sample(logits, 0.9, u)
    full = decoding.nucleus_full(probs, 0.9, u)
    assert torch.equal(tokens, full)
    assert tokens.tolist() == [twin_token(probs[i], 0.9, float(u[i])) for i in range(6)]


def test_a_rounding_swap_of_near_equal_tokens_moves_the_token_only_at_a_boundary() -> None:
    """Pairs of exactly tied tokens; a second distribution nudges each pair the other way round
    (relative 1e-12), so the probability order swaps every pair. The token changes only for
    uniforms within 1e-9 of a boundary of the inverse CDF; drawn in probability order it would
    change for a large share of the uniforms."""
    gen = torch.Generator().manual_seed(2)
    for vocab in (200, 1000, 50257):  # all candidates / the full sort / the top-k path
        logits = torch.randn(vocab // 2, generator=gen, dtype=torch.float64)
        scale = 1.0 if vocab < 50257 else 6.0  # peaked at 50,257: the nucleus within the top 256
        p = torch.softmax(scale * logits.repeat_interleave(2), -1)  # tokens 2i and 2i+1 tied
        q = p.clone()
        q[0::2] *= 1 - 1e-12
        q[1::2] *= 1 + 1e-12  # now 2i+1 comes before 2i in probability order
        top_p = _cut_after_a_pair(p, 0.9)
        assert kept(p, top_p) == kept(q, top_p)  # the same nucleus: only the order moved
        uniforms = [(i + 0.5) / 400 for i in range(400)]
        mine = [_tokens(x, top_p, uniforms) for x in (p, q)]
        assert mine == [twin_tokens(x, top_p, uniforms) for x in (p, q)]
        edges = _boundaries(p, top_p)
        for u, a, b in zip(uniforms, *mine, strict=True):
            assert a == b or min(abs(u - x) for x in edges) < 1e-9
        before = [_prob_order_tokens(x, top_p, uniforms) for x in (p, q)]
        assert sum(a != b for a, b in zip(*before, strict=True)) > 100  # the former order parted


def _cut_after_a_pair(p: torch.Tensor, near: float) -> float:
    """A top_p near `near` whose nucleus ends with a whole pair of tied tokens, half a token's
    mass away from either cut (so rounding cannot move the cut)."""
    values = sorted(p.tolist(), reverse=True)
    mass, n = 0.0, 0
    while mass < near or n % 2:
        mass += values[n]
        n += 1
    return mass - 0.5 * values[n - 1]

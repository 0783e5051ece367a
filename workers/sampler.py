"""Turning a row's next-token distribution into a token (`JOB_ID_VERSION` 4): a nucleus cut
that keeps every token within `CUT_TOL` below the cut's probability, then an exponential race
(Gumbel-max) on noise hashed from (rng seed, step, token id). The rule, why it holds within
rounding and what is exact: docs/design.md, "Jobs and identity".

`sample` tries the top `CANDIDATES` tokens first (`sample_topk`) and sorts fully only the rows
whose cut those do not decide (`sample_full`); on a CPU both give the same token. Methods that
cut the vocabulary themselves (DExperts, GeDi) cut by `cut_value` with the same tolerance.
"""

from __future__ import annotations

import math
from typing import Any

import torch

CANDIDATES = 256  # top-k tried first; rows whose cut they do not decide fall back to a full sort
CUT_TOL = 1e-3  # nats: tokens this close below the cut's log-probability are kept with it
_KEEP = math.exp(-CUT_TOL)
_SLICE = 1 << 15  # elements of noise computed at a time on a CPU
_M32 = 0xFFFFFFFF


def _mix32(x: Any) -> Any:
    """A 32-bit integer mixer on int64 tensors (or Python ints) holding values in [0, 2^32).

    xor-shift / multiply rounds with the constants of the `lowbias32` family from Wellons'
    hash-prospector; both multipliers are below 2^31, so products stay below 2^63 (no int64
    overflow on any device). A tensor is mixed in place (pass a temporary): a slice's
    temporaries are reused instead of allocated per operation.
    """
    x ^= x >> 16
    x *= 0x21F0AAAD
    x &= _M32
    x ^= x >> 15
    x *= 0x735A2D97
    x &= _M32
    x ^= x >> 15
    return x


def token_noise(seeds: torch.Tensor, step: int, ids: torch.Tensor) -> torch.Tensor:
    """(B, n) float64 log E for tokens (B, n) or (n,) `ids` at `step` of the jobs with (B,)
    int64 `seeds`: E = −log U, U = (2k + 1) · 2^−53 for k a 52-bit hash of (seed, step, id).

    Integer arithmetic elementwise on the seeds' device, so U has the same bits on a CPU and
    on CUDA, for a token alone or beside any others (the logs may differ in their last ulp).
    A row's two 32-bit keys mix (seed, step, lane); a token's two words are `_mix32(id ^ key)`.
    On a CPU the columns go in slices of `_SLICE` elements, so the temporaries stay in cache.
    """
    lo, hi = (seeds & _M32).unsqueeze(-1), ((seeds >> 32) & _M32).unsqueeze(-1)
    keys = [
        _mix32(lo ^ _mix32(hi ^ _mix32(((2 * step + lane) & _M32) ^ 0x9E3779B9))) for lane in (0, 1)
    ]

    def words(cols: torch.Tensor) -> torch.Tensor:
        bits = _mix32(cols ^ keys[0])
        bits >>= 12
        bits <<= 32
        bits |= _mix32(cols ^ keys[1])  # 20 + 32 bits
        bits *= 2
        bits += 1  # odd multiples of 2^-53: exact in float64, never 0 or 1
        u = bits.double()
        u *= 2.0**-53
        return u.log_().neg_().log_()

    width = ids.shape[-1] if ids.device.type != "cpu" else max(1, _SLICE // len(seeds))
    return torch.cat([words(ids[..., i : i + width]) for i in range(0, ids.shape[-1], width)], -1)


def cut_value(sorted_values: torch.Tensor, sorted_probs: torch.Tensor, mass: float) -> torch.Tensor:
    """(B, 1): the value at the first position where the cumulative probability of (B, n)
    `sorted_probs` reaches `mass` (the last position when it never does)."""
    cum = torch.cumsum(sorted_probs, dim=-1)
    at = (cum < mass).sum(-1, keepdim=True).clamp_max(cum.shape[-1] - 1)
    return sorted_values.gather(-1, at)


def _race(
    p: torch.Tensor, keep: torch.Tensor, ids: torch.Tensor, seeds: torch.Tensor, step: int
) -> torch.Tensor:
    """(B,) positions in (B, n) `p` of the race's winner among the `keep` tokens `ids`."""
    keys = token_noise(seeds, step, ids).neg_().add_(torch.log(p))  # log p − log E
    return keys.masked_fill_(~keep, -torch.inf).argmax(-1)


def sample_topk(
    probs: torch.Tensor, top_p: float, seeds: torch.Tensor, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, exact) from (B, V) float64 `probs` over their top `CANDIDATES`, without a host
    sync. `exact[i]` says the candidates decide row i's cut: it is reached among them, and the
    last candidate lies below the kept range (so does every other token). Rows that are not
    exact must be redone with `sample_full`."""
    q, ids = torch.topk(probs.float(), min(CANDIDATES, probs.shape[-1]), dim=-1)
    floor = cut_value(q.double(), q.double(), top_p) * _KEEP
    pos = _race(probs.gather(-1, ids), q >= floor, ids, seeds, step)
    tokens = ids.gather(-1, pos.unsqueeze(-1)).squeeze(-1)
    if q.shape[-1] == probs.shape[-1]:
        return tokens, torch.ones_like(tokens, dtype=torch.bool)
    return tokens, (q[:, -1:] < floor).squeeze(-1)


def sorted_descending(q: torch.Tensor) -> torch.Tensor:
    """(B, V) float32 `q` ≥ 0 sorted descending. On a CPU row by row, as a 1-D sort of the
    float32 bits read as int32 (which order like the floats; torch sorts them with a radix
    sort): ~1/4 of the batched float sort's cost. Elsewhere one batched sort."""
    if q.device.type != "cpu":
        return torch.sort(q, dim=-1, descending=True).values
    bits = q.contiguous().view(torch.int32)
    out = torch.empty_like(bits)
    for row, src in zip(out, bits, strict=True):
        row.copy_(torch.sort(src, stable=True).values.flip(0))
    return out.view(q.dtype)


def sample_full(probs: torch.Tensor, top_p: float, seeds: torch.Tensor, step: int) -> torch.Tensor:
    """(B,) tokens from (B, V) float64 `probs` with the cut found over a full sort."""
    q = probs.float()
    desc = sorted_descending(q).double()
    floor = cut_value(desc, desc, top_p) * _KEEP
    ids = torch.arange(probs.shape[-1], device=probs.device)
    return _race(probs, q >= floor, ids, seeds, step)


def sample(logprobs: torch.Tensor, top_p: float, seeds: torch.Tensor, step: int) -> torch.Tensor:
    """(B,) tokens from (B, V) log-probs, in float64: `sample_topk`, and `sample_full` for the
    rows it does not decide. A row's token depends only on its own distribution, seed and
    step, whichever path ran and whatever the batch."""
    probs = torch.softmax(logprobs.double(), dim=-1)
    tokens, exact = sample_topk(probs, top_p, seeds, step)
    redo = torch.nonzero(~exact).flatten()
    if redo.numel():
        tokens[redo] = sample_full(probs[redo], top_p, seeds[redo], step)
    return tokens

"""The two loss estimators of the UDDIA family: ℓ̂_g (property) and ℓ̂_a (demographic).

ℓ̂_g is the cross-entropy of an attribute head on mean-pooled final hidden states toward the
desirable class (the PPLM proxy). ℓ̂_a is UDDIA's estimate built on a gender direction `v` of
the input embeddings: `q(a | x) = σ(±10 · cos(E_x, v))` per vocabulary token and, for the
context version, the same with `r_x = (n·c̄ + E_x)/(n+1)`.

Fast form: the context terms need `cos(n c̄ + E_x, v)` for every x; with S = n c̄,
`‖S + E_x‖² = ‖S‖² + 2 (E S)_x + ‖E_x‖²` and `(S + E_x)·v = S·v + (E v)_x`, so one
matrix-vector product per sequence and step suffices; no (V, D) tensor is ever built per row.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from workers.methods.base import MethodError

if TYPE_CHECKING:
    from workers.models import LoadedLM

SHARPNESS = 10.0  # q(a|x) = σ(10·cos): UDDIA's softmax over (1±cos)/2 at temperature 0.1
GENDERED = 0.75  # B_a: tokens with q(a|x) above this count as clearly gendered
GATE_MARGIN = 0.1  # UDDIA applies ℓ̂_a iff |H(p, B_f) − H(p, B_m)| exceeds this
_CHUNK = 8192  # vocabulary rows per chunk when precomputing float32 per-token quantities


@dataclass(frozen=True)
class GenderGeometry:
    """Per-LM constants of ℓ̂_a, computed once; group order is `words.groups` (K = 2).

    q(groups[1] | x) = σ(10 cos(E_x, v)), with v pointing from groups[0] to groups[1] words.
    """

    groups: tuple[str, str]
    embed: torch.Tensor  # (V, D) the LM's input embeddings (shared, not copied)
    direction: torch.Tensor  # (D,) float32, unit norm
    proj: torch.Tensor  # (V,) float32: E_x · v
    sqnorm: torch.Tensor  # (V,) float32: ‖E_x‖²
    log_q: torch.Tensor  # (V, 2) float32: log q(a | x), context-free
    prior_term: torch.Tensor  # (V,) float32: Σ_a p(a) q(a|x) log(q(a|x)/p(a)), p uniform
    gendered: torch.Tensor  # (2, V) float32: B_a, distributions over clearly gendered tokens


def word_embedding(lm: LoadedLM, word: str) -> torch.Tensor | None:
    """Mean input embedding of `word`'s tokens (no leading space); None if it has an unknown token."""
    ids = list(lm.tokenizer(word, add_special_tokens=False)["input_ids"])
    unk = lm.tokenizer.unk_token_id
    if not ids or (unk is not None and unk in ids):
        return None
    embed = lm.model.get_input_embeddings().weight
    return embed[torch.tensor(ids, device=embed.device)].float().mean(0)


def gender_direction(lm: LoadedLM) -> torch.Tensor:
    """Unit (D,) vector: Σ over seed pairs of e(groups[1] word) − e(groups[0] word).

    Without pairs (a JSON word list), the difference of the two groups' mean embeddings.

    Raises:
        MethodError: not exactly two groups, or no usable seed word pair.
    """
    words = lm.words
    if len(words.groups) != 2:
        raise MethodError(f"ℓ̂_a needs exactly 2 groups of seed words, got {list(words.groups)}")
    pairs = [p for p in words.pairs if len(p) == 2]
    diffs = []
    for first, second in pairs:
        e0, e1 = word_embedding(lm, first), word_embedding(lm, second)
        if e0 is not None and e1 is not None:
            diffs.append(e1 - e0)
    if not pairs:
        means = []
        for group in words.groups:
            embs = [e for w in words.words[group] if (e := word_embedding(lm, w)) is not None]
            if embs:
                means.append(torch.stack(embs).mean(0))
        if len(means) == 2:
            diffs.append(means[1] - means[0])
    if not diffs:
        raise MethodError(f"ℓ̂_a: no seed word of {words.source} tokenises without unknown tokens")
    total = torch.stack(diffs).sum(0)
    norm = total.norm()
    if not torch.isfinite(norm) or float(norm) == 0.0:
        raise MethodError(f"ℓ̂_a: the gender direction of {words.source} is zero or not finite")
    return total / norm


# model object → {the word list's contents (groups, words, pairs): geometry}
_GEOMETRY: weakref.WeakKeyDictionary[Any, dict[str, GenderGeometry]] = weakref.WeakKeyDictionary()


def gender_geometry(lm: LoadedLM) -> GenderGeometry:
    """The per-LM constants of ℓ̂_a, cached per (model object, word list contents)."""
    key = repr((lm.words.groups, sorted(lm.words.words.items()), lm.words.pairs))
    cached = _GEOMETRY.get(lm.model, {}).get(key)
    if cached is not None:
        return cached
    with torch.no_grad():
        embed = lm.model.get_input_embeddings().weight.detach()
        v = gender_direction(lm)
        proj, sqnorm = [], []
        for chunk in embed.split(_CHUNK):
            c = chunk.float()
            proj.append(c @ v)
            sqnorm.append((c * c).sum(-1))
        p, n = torch.cat(proj), torch.cat(sqnorm)
        cos = p / n.clamp_min(1e-24).sqrt()
        log_q = torch.stack([F.logsigmoid(-SHARPNESS * cos), F.logsigmoid(SHARPNESS * cos)], -1)
        q = log_q.exp()
        prior_term = 0.5 * (q * (log_q + math.log(2.0))).sum(-1)
        gendered = (q * (q > GENDERED)).T.contiguous()  # uniform unigram prior
        gendered = gendered / gendered.sum(-1, keepdim=True).clamp_min(1e-30)
    geometry = GenderGeometry(
        (lm.words.groups[0], lm.words.groups[1]), embed, v, p, n, log_q, prior_term, gendered
    )
    _GEOMETRY.setdefault(lm.model, {})[key] = geometry
    return geometry


def demographic_scores(
    geo: GenderGeometry, gen_sum: torch.Tensor, es: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, V) s_x = KL(q(·|c,x) ‖ q(·|x)) + Σ_a p(a) q(a|x) log(q(a|x)/p(a)).

    Args:
        geo: the LM's gender geometry.
        gen_sum: (B, D) float32 sum S = n·c̄ of the input embeddings of the tokens generated so
            far (zero before the first token, where the KL term vanishes).
        es: (B, V) float32 (E S)ᵀ when computed already (the bias tuner's pass over E).
    """
    with torch.no_grad():
        if es is None:
            es = (geo.embed @ gen_sum.to(geo.embed.dtype).T).T.float()  # (B, V): the one mat-vec
        num = (gen_sum @ geo.direction).unsqueeze(-1) + geo.proj  # (B, V): (S + E_x)·v
        sq = (gen_sum * gen_sum).sum(-1, keepdim=True) + 2.0 * es + geo.sqnorm  # ‖S + E_x‖²
        cos = num / sq.clamp_min(1e-24).sqrt()
        log_qc = torch.stack([F.logsigmoid(-SHARPNESS * cos), F.logsigmoid(SHARPNESS * cos)], -1)
        kl = (log_qc.exp() * (log_qc - geo.log_q)).sum(-1)  # (B, V)
        return kl + geo.prior_term


def demographic_loss(probs: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """(B,) ℓ̂_a = Σ_x p_θ(x) s_x, differentiable through `probs` (B, V)."""
    return (probs * scores.to(probs.device)).sum(-1)


def property_loss(head: torch.nn.Module, pooled: torch.Tensor, target: int) -> torch.Tensor:
    """(B,) ℓ̂_g: cross-entropy of `head(pooled)` toward the desirable class `target`."""
    weight = next(head.parameters())
    logits = head(pooled.to(weight.device, weight.dtype)).float()  # (B, C)
    labels = torch.full((pooled.shape[0],), int(target), dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, labels, reduction="none")


def hellinger(probs: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    """(B,) Hellinger distance between rows of `probs` (B, V) and `dist` (V,)."""
    overlap = torch.sqrt(probs * dist).sum(-1)
    return torch.sqrt((1.0 - overlap).clamp_min(0.0))


def hellinger_gate(
    geo: GenderGeometry,
    probs: torch.Tensor,
    margin: float = GATE_MARGIN,
    gendered: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B,) bool: UDDIA's trigger for ℓ̂_a, |H(p_θ, B_f) − H(p_θ, B_m)| > margin.

    `gendered` is B_a (2, V) (default: `geo.gendered`, uniform prior). A group without any
    clearly gendered token has an all-zero B_a: H = 1 against it.
    """
    b = geo.gendered if gendered is None else gendered
    with torch.no_grad():
        h0 = hellinger(probs, b[0])
        h1 = hellinger(probs, b[1])
        return (h0 - h1).abs() > margin

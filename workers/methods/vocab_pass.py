"""The tuner's passes over the vocabulary: products with the output matrix W and the input
embeddings E, written as autograd functions so that no pass is made twice.

`ThetaLogits` takes θ's logits from the loop as the value (no forward product);
`vocab_forward` and `_ThetaVocab` compute the horizon's expected embedding Eᵀp and ℓ̂_a in one
pass over E forward and one backward, in chunks of rows that stay in cache on a CPU
(`_vocab_chunk`); `head_logits` is the tuned path's output product.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from workers.methods.estimators import GenderGeometry, demographic_loss, demographic_scores

if TYPE_CHECKING:
    from workers.methods.base import StepContext


class ThetaLogits(torch.autograd.Function):
    """θ's logits as the value, `hidden @ Wᵀ` as the derivative: no second forward product."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor) -> Any:
        ctx.save_for_backward(weight)
        ctx.hidden_meta = (hidden.dtype, hidden.device)
        return logits.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (weight,) = ctx.saved_tensors
        dtype, device = ctx.hidden_meta
        g = grad.to(device=weight.device, dtype=weight.dtype) @ weight  # (B, D)
        return g.to(device=device, dtype=dtype), None, None


CPU_VOCAB_CHUNK = 1024  # rows of the output matrix per product on a CPU (see _vocab_chunk)


def _vocab_chunk(matrix: torch.Tensor) -> int:
    """Rows of a (V, D) matrix per product in the passes over the vocabulary: on a CPU, chunks
    of 1,024 rows give the same dot products for ~30 % less CPU time at B = 8 (each chunk stays
    in cache, and two products with it read it once); on an accelerator, one product."""
    return CPU_VOCAB_CHUNK if matrix.device.type == "cpu" else int(matrix.shape[0])


def _same_matrix(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same matrix (tied input and output embeddings)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def vocab_forward(
    probs: torch.Tensor, embed: torch.Tensor, weight: torch.Tensor, gen_sum: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass over the vocabulary: (Eᵀp, Wᵀp, (E S)ᵀ), all float32, no gradient.

    Eᵀp is the horizon's expected embedding, Wᵀp (the same tensor when E and W are tied) is
    what the backward of softmax + output layer needs, and (E S)ᵀ (B, V) is ℓ̂_a's product with
    the sum S of generated embeddings (`gen_sum`; None: S = 0, zeros without a product).

    The chunks' products are summed in float64: one float32 product over a real vocabulary
    drops the many tiny p(x)·E(x) terms against a large partial sum.
    """
    tied = _same_matrix(weight, embed)
    step = _vocab_chunk(embed)
    B, V = probs.shape
    wide = torch.float64
    m = torch.zeros((B, embed.shape[1]), dtype=wide, device=embed.device)
    pw = m if tied else torch.zeros((B, weight.shape[1]), dtype=wide, device=weight.device)
    es = (torch.zeros if gen_sum is None else torch.empty)(
        (B, V), dtype=embed.dtype, device=embed.device
    )
    with torch.no_grad():
        for i in range(0, V, step):
            rows = slice(i, i + step)
            chunk = embed[rows]
            m += torch.mm(probs[:, rows], chunk).to(wide)
            if not tied:
                pw += torch.mm(probs[:, rows], weight[rows]).to(wide)
            if gen_sum is not None:
                torch.mm(gen_sum, chunk.T, out=es[:, rows])
    m32 = m.to(embed.dtype)
    return m32, m32 if tied else pw.to(weight.dtype), es


class _ThetaVocab(torch.autograd.Function):
    """(Eᵀp_θ, Σ_x p_θ(x) s_x) as functions of θ's last final hidden state, p_θ = softmax(h Wᵀ).

    The values come from `vocab_forward` (θ's logits are the loop's: no forward product); the
    backward is one pass over the vocabulary: with dp = E g_m + g_a s and κ = Σ_x p_x dp_x,
    ∂/∂h = Σ_x p_x dp_x W_x − κ Wᵀp (softmax's Jacobian folded in), each chunk of E and W used
    for both of its products while it is in cache.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: torch.Tensor,
        probs: torch.Tensor,
        m: torch.Tensor,
        pw: torch.Tensor,
        scores: torch.Tensor,
        embed: torch.Tensor,
        weight: torch.Tensor,
    ) -> Any:
        ctx.save_for_backward(probs, pw, scores, embed, weight)
        ctx.hidden_meta = (hidden.dtype, hidden.device)
        return m.clone(), (probs * scores).sum(-1)

    @staticmethod
    def backward(ctx: Any, grad_m: torch.Tensor, grad_a: torch.Tensor) -> Any:
        probs, pw, scores, embed, weight = ctx.saved_tensors
        dtype, device = ctx.hidden_meta
        tied = _same_matrix(weight, embed)
        step = _vocab_chunk(embed)
        B, V = probs.shape
        grad_m = grad_m.to(embed.device, embed.dtype)
        grad_a = grad_a.to(embed.device, embed.dtype).unsqueeze(-1)
        wide = torch.float64  # the chunks' sums, as in vocab_forward
        acc = torch.zeros((B, weight.shape[1]), dtype=wide, device=weight.device)
        kappa = torch.zeros((B, 1), dtype=wide, device=weight.device)
        for i in range(0, V, step):
            rows = slice(i, i + step)
            chunk = embed[rows]
            wdp = probs[:, rows] * torch.addcmul(grad_m @ chunk.T, grad_a, scores[:, rows])
            acc += torch.mm(wdp, chunk if tied else weight[rows]).to(wide)
            kappa += wdp.sum(-1, keepdim=True, dtype=wide)
        grad_h = acc - kappa * pw.to(wide)
        return grad_h.to(device=device, dtype=dtype), None, None, None, None, None, None


def expectations(
    ctx: StepContext,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    demographic: tuple[GenderGeometry, torch.Tensor | None] | None,
    embed: torch.Tensor,
    weight: torch.Tensor,
    fused: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(horizon input embeddings (B, 1, D) or None, ℓ̂_a (B,) or None) of the probe.

    A float32 model with E and W on one device takes the fused passes (`_ThetaVocab`): p_θ
    enters E and W once in the forward and once in the backward. Otherwise (half precision,
    split models) the horizon embeds softmax(logits) in the tuner's `_horizon_forward` and ℓ̂_a is the
    plain expectation.
    """
    gen_sum = None if demographic is None else demographic[1]
    if not fused:
        if demographic is None:
            return None, None
        geo = demographic[0]
        zero = torch.zeros((hidden.shape[0], geo.embed.shape[1]), device=geo.embed.device)
        scores = demographic_scores(geo, zero if gen_sum is None else gen_sum)
        return None, demographic_loss(torch.softmax(logits, dim=-1), scores)
    with torch.no_grad():
        probs = torch.softmax(ctx.logits.float().to(embed.device), dim=-1)
        m, pw, es = vocab_forward(probs, embed, weight, gen_sum)
        if demographic is None:
            scores = probs.new_zeros(()).expand(probs.shape)
        else:
            s = torch.zeros_like(m) if gen_sum is None else gen_sum
            scores = demographic_scores(demographic[0], s, es)
    embeds, loss_a = _ThetaVocab.apply(hidden, probs, m, pw, scores, embed.detach(), weight)
    return embeds.unsqueeze(1), (loss_a if demographic is not None else None)


def head_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """(B, V) float32 logits of (B, D) final hidden states (float32 output matrix if half),
    over row chunks of `weight` (`_vocab_chunk`: the same dot products)."""
    hidden, step = hidden.to(weight.device, weight.dtype), _vocab_chunk(weight)
    if step >= weight.shape[0]:
        logits = hidden @ weight.T
    else:
        logits = hidden.new_empty((hidden.shape[0], weight.shape[0]))
        for i in range(0, weight.shape[0], step):
            torch.mm(hidden, weight[i : i + step].T, out=logits[:, i : i + step])
    if bias is not None:
        logits = logits + bias.to(logits.device)
    return logits.float()

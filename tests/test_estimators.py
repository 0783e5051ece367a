"""The loss estimators: ℓ̂_a in fast form against a direct computation, ℓ̂_g, the Hellinger gate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from jobs.spec import ModelRef
from jobs.words import from_pairs
from workers.methods.estimators import (
    GenderGeometry,
    demographic_loss,
    demographic_scores,
    gender_direction,
    gender_geometry,
    hellinger,
    hellinger_gate,
    property_loss,
    word_embedding,
)
from workers.models import LoadedLM, load_lm


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def lm(request: pytest.FixtureRequest) -> LoadedLM:
    return load_lm(ModelRef(f"tiny-random/{request.param}"), device="cpu")


def direct_scores(lm: LoadedLM, generated: list[int]) -> torch.Tensor:
    """(V,) s_x written out from the definition, materialising r_x for every x (float64)."""
    E = lm.model.get_input_embeddings().weight.double()
    v = gender_direction(lm).double()

    def q_male(rows: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(10.0 * (rows @ v) / rows.norm(dim=-1))

    qx = torch.stack([1 - q_male(E), q_male(E)], -1)  # (V, 2) q(a | x)
    n = len(generated)
    if n:
        cbar = E[generated].mean(0)
        r = (n * cbar + E) / (n + 1)  # (V, D)
        qcx = torch.stack([1 - q_male(r), q_male(r)], -1)
    else:
        qcx = qx
    kl = (qcx * (qcx / qx).log()).sum(-1)
    prior = (0.5 * qx * (qx / 0.5).log()).sum(-1)
    return kl + prior


def test_fast_demographic_scores_equal_the_direct_form(lm: LoadedLM) -> None:
    geo = gender_geometry(lm)
    torch.manual_seed(0)
    rows = [[], [5, 40, 41], torch.randint(3, len(lm.tokenizer), (9,)).tolist()]
    E = geo.embed.float()
    gen_sum = torch.stack([E[r].sum(0) if r else torch.zeros(E.shape[1]) for r in rows])
    fast = demographic_scores(geo, gen_sum)
    assert torch.isfinite(fast).all()  # a zero embedding row (LLaMA's pad) reads as neutral
    real = E.norm(dim=-1) > 0
    for b, r in enumerate(rows):
        torch.testing.assert_close(
            fast[b, real].double(), direct_scores(lm, r)[real], rtol=1e-4, atol=1e-6
        )
    assert torch.equal(fast[0], geo.prior_term)  # no generated tokens: the KL term is exactly 0


def test_demographic_loss_is_the_expectation_and_differentiable_in_p(lm: LoadedLM) -> None:
    geo = gender_geometry(lm)
    scores = demographic_scores(geo, torch.zeros(2, geo.embed.shape[1]))
    logits = torch.randn(2, scores.shape[1], requires_grad=True)
    loss = demographic_loss(logits.softmax(-1), scores)
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    p = logits.detach().softmax(-1)
    torch.testing.assert_close(
        grad, p * (scores - loss.detach().unsqueeze(-1)), rtol=1e-4, atol=1e-7
    )


def test_direction_uses_the_mean_embedding_of_each_word_without_space() -> None:
    tiny = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    one_pair = replace(tiny, words=from_pairs((("best-known", "he"),), ("female", "male"), "test"))
    E = tiny.model.get_input_embeddings().weight
    ids = tiny.tokenizer("best-known", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3  # best, -, known
    expected = E[tiny.tokenizer.convert_tokens_to_ids("he")] - E[ids].mean(0)
    torch.testing.assert_close(gender_direction(one_pair), expected / expected.norm())
    swapped = replace(tiny, words=from_pairs((("he", "best-known"),), ("male", "female"), "test"))
    torch.testing.assert_close(gender_direction(swapped), -gender_direction(one_pair))


def test_unknown_words_are_skipped() -> None:
    tiny = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    words = from_pairs((("zzqx", "qqzz"), ("she", "he")), ("female", "male"), "test")
    only_known = from_pairs((("she", "he"),), ("female", "male"), "test")
    assert word_embedding(tiny, "zzqx") is None
    torch.testing.assert_close(
        gender_direction(replace(tiny, words=words)),
        gender_direction(replace(tiny, words=only_known)),
    )


def test_gendered_distributions(lm: LoadedLM) -> None:
    geo = gender_geometry(lm)
    q = geo.log_q.exp()  # (V, 2)
    for a in range(2):
        support = q[:, a] > 0.75
        assert support.any()
        torch.testing.assert_close(geo.gendered[a].sum(), torch.tensor(1.0))
        assert torch.equal(geo.gendered[a] > 0, support)
        ratio = geo.gendered[a][support] / q[support, a]
        torch.testing.assert_close(ratio, ratio[0].expand_as(ratio))  # ∝ q(a|x), uniform prior


def test_property_loss_is_cross_entropy_toward_target() -> None:
    torch.manual_seed(3)
    head = torch.nn.Linear(8, 3)
    pooled = torch.randn(4, 8)
    got = property_loss(head, pooled, target=2)
    logits = (pooled.double() @ head.weight.double().T) + head.bias.double()
    expected = -(logits.log_softmax(-1)[:, 2])
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)


def _toy_geometry(gendered: torch.Tensor) -> GenderGeometry:
    V = gendered.shape[1]
    zeros = torch.zeros(V)
    return GenderGeometry(
        ("female", "male"),
        torch.eye(V),
        torch.ones(V) / math.sqrt(V),
        zeros,
        zeros,
        torch.zeros(V, 2),
        zeros,
        gendered,
    )


def test_hellinger_gate() -> None:
    geo = _toy_geometry(torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5]]))
    probs = torch.tensor(
        [
            [0.5, 0.5, 0.0, 0.0],  # all female mass: H_f = 0, H_m = 1
            [0.25, 0.25, 0.25, 0.25],  # symmetric: equal distances
            [0.3, 0.25, 0.25, 0.2],  # slightly tilted: below the 0.1 margin
        ]
    )
    h = hellinger(probs, geo.gendered[0])
    expected = torch.sqrt(1 - torch.sqrt(probs * geo.gendered[0]).sum(-1))
    torch.testing.assert_close(h, expected)
    assert hellinger_gate(geo, probs).tolist() == [True, False, False]


def test_empty_gendered_group_counts_as_far() -> None:
    geo = _toy_geometry(torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))
    probs = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert hellinger(probs, geo.gendered[0]).tolist() == [1.0, 1.0]
    assert hellinger_gate(geo, probs).tolist() == [True, False]


def test_geometry_is_cached_per_model(lm: LoadedLM) -> None:
    assert gender_geometry(lm) is gender_geometry(lm)
    assert F.softmax(gender_geometry(lm).log_q, -1).shape == (len(lm.tokenizer), 2)

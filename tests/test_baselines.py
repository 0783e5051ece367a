"""The paper's baselines (PPLM, GeDi, DExperts) on tiny models, through the shared decoding loop:
what they share (zero strength, batches, row-wise cuts, CUDA) and their extra models."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.spec import ModelRef
from tests.agreement import assert_alone_matches_batched, assert_same_samples, traced
from tests.baseline_helpers import (
    GEDI_TEST,
    GEN,
    PROMPTS,
    build,
    make_jobs,
    run,
)
from workers.methods.base import MethodError
from workers.methods.dexperts import nucleus_filter
from workers.methods.experts import load_extra_lm
from workers.methods.gedi import gedi_filter
from workers.models import LoadedLM, load_lm

# --- zero strength is vanilla, token for token -------------------------------------------------


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("pplm", {"steps": 0}),
        ("pplm", {"steps": 2, "step_size": 0.0}),  # runs the perturbed-cache path with Δ = 0
        (
            "dexperts",
            {
                "expert": "tiny-random/gpt2",
                "anti_expert": "tiny-random/opt",
                "alpha": 0.0,
                "filter_p": 1.0,
            },
        ),
        ("gedi", {**GEDI_TEST, "disc_weight": 0.0, "filter_p": 0.0}),
    ],
)
def test_zero_strength_reproduces_vanilla(
    lm: LoadedLM, method: str, params: dict[str, Any]
) -> None:
    # Same noise (common random numbers); distributions equal within rounding, since the
    # method's compute path (e.g. PPLM's perturbed cache) may round differently from vanilla's.
    _, zero = traced(lm, build(lm, method, params), make_jobs(lm, method, params, PROMPTS))
    _, plain = traced(lm, build(lm, "vanilla", {}), make_jobs(lm, "vanilla", {}, PROMPTS))
    compared = sum(assert_same_samples(zero, i, plain, i, GEN.top_p) for i in range(len(PROMPTS)))
    assert compared >= len(PROMPTS)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("pplm", {"steps": 2}),
        # The experts' own hard cuts (DExperts' top-p filter, GeDi's filter) are off here: they
        # are row-wise (test_method_filters_are_row_wise) but a value within rounding of the
        # cut's edge may fall either side when the batch shape changes the rounding.
        (
            "dexperts",
            {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/opt", "filter_p": 1.0},
        ),
        ("gedi", {**GEDI_TEST, "filter_p": 0.0}),
    ],
)
def test_a_job_samples_alike_alone_or_in_a_batch(
    lm: LoadedLM, method: str, params: dict[str, Any]
) -> None:
    built = build(lm, method, params)
    assert_alone_matches_batched(lm, built, make_jobs(lm, method, params, PROMPTS))
    # the method is active: its first distribution is not vanilla's (the race, on common
    # noise, may still draw vanilla's tokens from a distribution this close to it)
    _, mine = traced(lm, built, make_jobs(lm, method, params, PROMPTS))
    _, plain = traced(lm, build(lm, "vanilla", {}), make_jobs(lm, "vanilla", {}, PROMPTS))
    moved = (mine[0].logprobs.exp() - plain[0].logprobs.exp()).abs().max()
    assert float(moved) > 1e-4, float(moved)


def test_method_filters_are_row_wise() -> None:
    """GeDi's and DExperts' cuts give each row what it gets alone, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(5, 300, generator=gen)
    desired = torch.log_softmax(torch.randn(5, 300, generator=gen), -1)
    desired[1, :50] = desired[1, 50]  # exact ties in desirability
    batch_g = gedi_filter(scores, desired, 0.8, 0.8)
    batch_d = nucleus_filter(scores, 0.9)
    for i in range(5):
        assert torch.equal(
            batch_g[i], gedi_filter(scores[i : i + 1], desired[i : i + 1], 0.8, 0.8)[0]
        )
        assert torch.equal(batch_d[i], nucleus_filter(scores[i : i + 1], 0.9)[0])


def test_filter_cuts_keep_exact_ties_together_in_any_batch() -> None:
    """At a cut through exactly tied tokens, GeDi and DExperts keep every tied token (the
    sampler's cut, `workers.sampler.cut_value`): no tie is broken by id or by the sort kernel,
    and a row gets the same tokens alone, at any row of any batch, beside rows of any content."""
    V = 600  # above the sizes where a sort may fall back to a simple (stable) loop
    scores = torch.zeros(V)  # every token holds 1/V of the mass
    desired = torch.full((V,), math.log(0.5))
    desired[::2] = math.log(0.9)  # even ids are desirable (above target_p), odd ids tie below
    desired[1] = math.log(0.1)  # the least desirable token
    # filter_p = 0.2495: the mass from the least desirable end reaches it inside the tied odd
    # ids, so only token 1 (below the tie) is dropped
    want = torch.zeros(V, dtype=torch.bool)
    want[1] = True
    tied = torch.zeros(V)
    tied[200:300] = 3.0  # 100 tied tokens hold ~97 % of the mass: a cut at 0.5 falls among them
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 3, 8):
        for row in range(batch):
            s = torch.randn(batch, V, generator=gen)
            d = torch.log_softmax(torch.randn(batch, V, generator=gen), -1)
            s[row], d[row] = scores, desired
            dropped = gedi_filter(s, d, 0.2495, 0.8)[row] < -5000
            assert torch.equal(dropped, want), (batch, row)
            s[row] = tied
            kept = torch.isfinite(nucleus_filter(s, 0.5)[row])
            assert torch.equal(kept.nonzero().flatten(), torch.arange(200, 300)), (batch, row)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("method", "active", "zero"),
    [
        ("pplm", {"steps": 2}, {"steps": 2, "step_size": 0.0}),
        ("gedi", GEDI_TEST, {**GEDI_TEST, "disc_weight": 0.0, "filter_p": 0.0}),
        (
            "dexperts",
            {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/opt"},
            {
                "expert": "tiny-random/gpt2",
                "anti_expert": "tiny-random/opt",
                "alpha": 0.0,
                "filter_p": 1.0,
            },
        ),
    ],
)
def test_baselines_run_on_cuda(method: str, active: dict[str, Any], zero: dict[str, Any]) -> None:
    cuda = load_lm(ModelRef("tiny-random/gpt2"), device="cuda")
    assert all(len(t) > 0 for t in run(cuda, method, active))
    _, at_zero = traced(cuda, build(cuda, method, zero), make_jobs(cuda, method, zero, PROMPTS))
    _, plain = traced(cuda, build(cuda, "vanilla", {}), make_jobs(cuda, "vanilla", {}, PROMPTS))
    for i in range(len(PROMPTS)):  # CUDA kernels round differently by path: within 1e-4
        assert_same_samples(at_zero, i, plain, i, GEN.top_p, tol=1e-4)


# --- extra models ------------------------------------------------------------------------------


def test_an_expert_with_another_tokenizer_is_refused(lm: LoadedLM, models: dict[str, str]) -> None:
    with pytest.raises(
        MethodError, match="different tokenizer.*only in dexperts expert: \\['zebra'\\]"
    ):
        load_extra_lm(lm, models["other"], "expert", "dexperts")
    with pytest.raises(MethodError, match="gedi gedi_model .* different tokenizer"):
        build(lm, "gedi", {**GEDI_TEST, "gedi_model": models["other"]})


def test_missing_experts_are_clear_errors(lm: LoadedLM, tmp_path: Path) -> None:
    with pytest.raises(MethodError, match="anti_expert: required: a hub id or local path"):
        build(lm, "dexperts", {"expert": "tiny-random/gpt2"})
    with pytest.raises(MethodError, match="gedi_model: required: a hub id or local path"):
        build(lm, "gedi", {})
    with pytest.raises(MethodError, match=f"expert '{tmp_path / 'nothing'}': cannot load"):
        build(
            lm, "dexperts", {"expert": str(tmp_path / "nothing"), "anti_expert": "tiny-random/gpt2"}
        )
    with pytest.raises(MethodError, match="no published alpha for task 'regard'"):
        build(
            lm,
            "dexperts",
            {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/gpt2"},
            task="regard",
        )

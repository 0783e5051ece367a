"""Bias-tuning engine: hook points, offsets, closed-form Adam, probe gradients, cache safety."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jobs.spec import JobSpec, ModelRef
from tests.helpers import step0_context
from tests.precision import adam_first_step
from workers.methods.base import MethodError, StepContext
from workers.methods.biastune import (
    affine_width,
    bias_offsets,
    cropped_cache,
    find_sites,
)
from workers.methods.tuner import BiasTuner
from workers.models import LoadedLM, load_lm

FAMILIES = ("gpt2", "opt", "falcon", "llama", "gemma3")
PROMPTS = ["The woman worked as a", "He said"]  # different lengths: row 1 is left padded


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request: pytest.FixtureRequest) -> LoadedLM:
    return load_lm(ModelRef(f"tiny-random/{request.param}"), device="cpu")


def step0(lm: LoadedLM, prompts: list[str]) -> StepContext:
    """The StepContext of the first step, built the way the shared loop builds it."""
    jobs = [
        JobSpec(f"p{i}", p, "female", None, 0, "lidao-min", lm.ref, "sentiment")
        for i, p in enumerate(prompts)
    ]
    return step0_context(lm, prompts, jobs)


def test_sites_cover_affine_modules_of_top_blocks(lm: LoadedLM) -> None:
    sites = find_sites(lm.model, 2)
    top = {f"{sites.blocks_path}.{i}." for i in (2, 3)}
    assert sites.num_blocks == 4 and sites.k == 2
    assert all(any(p.name.startswith(t) for t in top) for p in sites.points[:-1])
    assert sites.has_final_norm  # the last hook point
    assert sites.points[-1].name.split(".")[-1] in ("ln_f", "norm", "final_layer_norm")
    # every affine sub-module of the tuned blocks is a hook point, nothing else is
    block = lm.model.get_submodule(f"{sites.blocks_path}.3")
    kinds = {type(m).__name__ for m in block.modules() if hasattr(m, "weight")}
    hooked = {
        type(p.module).__name__
        for p in sites.points
        if p.name.startswith(f"{sites.blocks_path}.3.")
    }
    assert hooked == kinds


def test_gpt2_offsets_are_exactly_its_bias_vectors() -> None:
    gpt2 = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    sites = find_sites(gpt2.model, 18)  # clamped to the 4 blocks
    biases = sum(
        p.numel() for n, p in gpt2.model.named_parameters() if n.endswith("bias") and ".h." in n
    )
    ln_f = gpt2.model.transformer.ln_f.bias.numel()
    assert sites.k == 4 and sites.numel() == biases + ln_f == 4 * 11 * 64 + 64


def test_unmappable_architecture_raises() -> None:
    from transformers import PretrainedConfig

    class NoNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = PretrainedConfig()
            self.config.num_hidden_layers = 2
            self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4)) for _ in range(2)])

    with pytest.raises(MethodError, match="no final norm"):
        find_sites(NoNorm(), 2)
    with pytest.raises(MethodError, match="decoder block list"):
        find_sites(nn.Sequential(nn.Linear(2, 2)), 2)


def test_zero_offsets_change_nothing_and_rows_are_independent(lm: LoadedLM) -> None:
    ctx = step0(lm, PROMPTS)
    sites = find_sites(lm.model, 2)
    kwargs: dict[str, Any] = {
        "input_ids": ctx.input_ids,
        "attention_mask": ctx.attention_mask,
        "position_ids": ctx.position_ids,
    }
    with torch.no_grad():
        plain = lm.model(**kwargs).logits
        zeros = [torch.zeros(2, p.width) for p in sites.points]
        with bias_offsets(lm.model, sites, zeros):
            zero = lm.model(**kwargs).logits
        row1 = [torch.zeros(2, p.width) for p in sites.points]
        row1[-1][1] = 0.5  # final norm offset of row 1 only
        with bias_offsets(lm.model, sites, row1):
            tuned = lm.model(**kwargs).logits
    assert torch.equal(zero, plain)
    assert torch.equal(tuned[0], plain[0])
    assert not torch.allclose(tuned[1], plain[1])


def test_hooks_removed_when_the_block_raises(lm: LoadedLM) -> None:
    sites = find_sites(lm.model, 2)
    deltas = [torch.zeros(3, p.width) for p in sites.points]  # batch 3 vs inputs of batch 2
    ctx = step0(lm, PROMPTS)
    with pytest.raises(MethodError, match="does not match"), bias_offsets(lm.model, sites, deltas):
        lm.model(input_ids=ctx.input_ids, attention_mask=ctx.attention_mask)
    with pytest.raises(RuntimeError, match="boom"), bias_offsets(lm.model, sites, None):
        raise RuntimeError("boom")
    assert all(not m._forward_hooks for m in lm.model.modules())


def test_missing_hook_point_raises() -> None:
    gpt2 = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    model = copy.deepcopy(gpt2.model)
    sites = find_sites(model, 2)
    model.transformer.h[3].mlp.c_fc = copy.deepcopy(model.transformer.h[3].mlp.c_fc)
    with pytest.raises(MethodError, match=r"transformer\.h\.3\.mlp\.c_fc is missing"):
        with bias_offsets(model, sites, None):
            pass
    assert all(not m._forward_hooks for m in model.modules())


def test_closed_form_equals_one_fresh_torch_adam_step() -> None:
    torch.manual_seed(0)
    g = torch.randn(4, 9) * torch.logspace(-12, 3, 9)  # magnitudes around and far from eps
    g[0, 0] = 0.0
    for lr in (0.01, 0.006):
        p = torch.zeros_like(g, requires_grad=True)
        opt = torch.optim.Adam([p], lr=lr, betas=(0.9, 0.999), eps=1e-8)
        p.grad = g.clone()
        opt.step()
        torch.testing.assert_close(adam_first_step([g], lr)[0], p.detach(), rtol=1e-6, atol=1e-12)


def _row_loss(
    head: nn.Linear, pooled: torch.Tensor, logits: torch.Tensor, scores: torch.Tensor
) -> torch.Tensor:
    """A stand-in objective with both estimator shapes: CE of a head + Σ_x p(x) s_x."""
    labels = torch.zeros(pooled.shape[0], dtype=torch.long)
    return F.cross_entropy(head(pooled), labels, reduction="none") + (
        logits.softmax(-1) * scores
    ).sum(-1)


def _reference_grads(
    lm: LoadedLM, prompt: str, k: int, scope: str, head: nn.Linear, scores: torch.Tensor
) -> list[torch.Tensor]:
    """Brute force: make the real bias vectors of GPT-2 / OPT trainable, no hooks, one row."""
    model = copy.deepcopy(lm.model)
    sites = find_sites(model, k)
    params: list[torch.Tensor] = [p.module.bias for p in sites.points]  # type: ignore[misc]
    for p in params:
        p.requires_grad_(True)
    ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"]
    embed = model.get_input_embeddings().weight
    if scope == "context":  # every position recomputed: two plain full forwards
        probs = model(input_ids=ids).logits[0, -1].softmax(-1)
        embeds = torch.cat([embed[ids[0]], (probs @ embed)[None]])[None]
        pooled = model.base_model(inputs_embeds=embeds).last_hidden_state[0].mean(0)
    else:  # context states are constants of θ
        with torch.no_grad():
            past = model.base_model(input_ids=ids[:, :-1], use_cache=True)
        last = model.base_model(input_ids=ids[:, -1:], past_key_values=past.past_key_values)
        probs = model.get_output_embeddings()(last.last_hidden_state[0, -1]).softmax(-1)
        hor = model.base_model(
            inputs_embeds=(probs @ embed)[None, None], past_key_values=last.past_key_values
        )
        total = (
            past.last_hidden_state[0].sum(0)
            + last.last_hidden_state[0, -1]
            + hor.last_hidden_state[0, -1]
        )
        pooled = total / (ids.shape[1] + 1)
    loss = _row_loss(head, pooled[None], torch.log(probs)[None], scores)
    return list(torch.autograd.grad(loss.sum(), params))


@pytest.mark.parametrize("family", ["gpt2", "opt"])
@pytest.mark.parametrize("scope", ["context", "last"])
def test_batched_gradient_equals_brute_force_per_row(family: str, scope: str) -> None:
    lm = load_lm(ModelRef(f"tiny-random/{family}"), device="cpu")
    torch.manual_seed(1)
    head = nn.Linear(64, 2)
    scores = torch.rand(len(lm.tokenizer))
    tuner = BiasTuner(lm, 2, scope)
    ctx = step0(lm, PROMPTS)
    probe = tuner.probe(ctx)
    loss = _row_loss(head, probe.pooled, probe.logits, scores)
    grads = torch.autograd.grad(loss.sum(), probe.deltas)
    for row, prompt in enumerate(PROMPTS):
        expected = _reference_grads(lm, prompt, 2, scope, head, scores)
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-6)


def test_scopes_agree_without_context(lm: LoadedLM) -> None:
    """With a one-token prompt there is no cached context: both scopes give the same gradient."""
    ctx = step0(lm, ["She"])
    torch.manual_seed(2)
    head, scores = nn.Linear(64, 2), torch.rand(len(lm.tokenizer))
    grads = {}
    for scope in ("context", "last"):
        probe = BiasTuner(lm, 3, scope).probe(ctx)
        grads[scope] = torch.autograd.grad(
            _row_loss(head, probe.pooled, probe.logits, scores).sum(), probe.deltas
        )
    for a, b in zip(grads["context"], grads["last"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("scope", ["context", "last"])
def test_tuning_leaves_cache_and_weights_untouched(lm: LoadedLM, scope: str) -> None:
    ctx = step0(lm, PROMPTS)
    keys = [layer.keys.clone() for layer in ctx.past_key_values.layers]
    weights = {n: p.clone() for n, p in lm.model.state_dict().items()}
    tuner = BiasTuner(lm, 2, scope)
    probe = tuner.probe(ctx)
    loss = probe.pooled.square().sum(-1) + probe.logits.logsumexp(-1)
    deltas = tuner.step(probe, loss, torch.ones(2, dtype=torch.bool), lr=0.5)
    tuned = tuner.tuned_logits(ctx, deltas)
    assert not torch.allclose(tuned, ctx.logits)  # the offsets did act
    assert ctx.past_key_values.get_seq_length() == ctx.input_ids.shape[1]
    assert all(torch.equal(a, layer.keys) for a, layer in zip(keys, ctx.past_key_values.layers))
    assert all(torch.equal(p, weights[n]) for n, p in lm.model.state_dict().items())
    assert all(not m._forward_hooks for m in lm.model.modules())


def test_zero_step_recomputes_theta_last_position(lm: LoadedLM) -> None:
    ctx = step0(lm, PROMPTS)
    tuner = BiasTuner(lm, 2, "last")
    zeros = [torch.zeros(2, p.width) for p in tuner.sites.points]
    torch.testing.assert_close(tuner.tuned_logits(ctx, zeros), ctx.logits, rtol=1e-5, atol=1e-5)
    view = cropped_cache(ctx.past_key_values, ctx.input_ids.shape[1] - 1)
    assert view.get_seq_length() == ctx.input_ids.shape[1] - 1


def test_failed_rows_get_zero_offsets(lm: LoadedLM) -> None:
    ctx = step0(lm, PROMPTS)
    tuner = BiasTuner(lm, 2, "context")
    probe = tuner.probe(ctx)
    loss = probe.pooled.sum(-1) * torch.tensor([1.0, float("nan")])
    deltas = tuner.step(probe, loss, torch.tensor([True, False]), lr=0.01)
    assert all(torch.isfinite(d).all() and not d[1].any() for d in deltas)
    assert any(d[0].abs().sum() > 0 for d in deltas)


@pytest.mark.parametrize("scope", ["context", "last"])
def test_tuned_forward_replays_the_lower_blocks(lm: LoadedLM, scope: str) -> None:
    ctx = step0(lm, PROMPTS)
    tuner = BiasTuner(lm, 2, scope)
    probe = tuner.probe(ctx)
    loss = probe.pooled.square().sum(-1) + probe.logits.logsumexp(-1)
    deltas = tuner.step(probe, loss, torch.ones(2, dtype=torch.bool), lr=0.5)
    inner = next(m for m in tuner.rerun.lower[0].modules() if affine_width(m) is not None)
    calls: list[int] = []
    handle = inner.register_forward_hook(lambda *args: calls.append(1))
    try:
        fast = tuner.tuned_logits(ctx, deltas)
        assert not calls  # the θ-only blocks were not recomputed
        tuner.replay = False
        slow = tuner.tuned_logits(ctx, deltas)
        assert calls
    finally:
        handle.remove()
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert all("forward" not in vars(block) for block in tuner.rerun.lower)


@pytest.mark.parametrize("scope", ["context", "last"])
def test_fused_vocabulary_passes_equal_the_plain_products(lm: LoadedLM, scope: str) -> None:
    """ℓ̂_a and the horizon through `_ThetaVocab` (one pass over E forward, one backward; tied
    and untied output matrices) against softmax → Eᵀp and Σ p·s as plain autograd: same
    values and same gradients (float32 rounding)."""
    from workers.methods.estimators import gender_geometry

    ctx = step0(lm, PROMPTS)
    geo = gender_geometry(lm)
    torch.manual_seed(3)
    gen_sum = torch.randn(2, geo.embed.shape[1]) * geo.embed.float().norm(dim=-1).mean()
    results: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]]
    results = {}
    for variant in ("plain", "fused", "untied"):
        tuner = BiasTuner(lm, 2, scope)
        assert tuner._fused  # float32 tiny models take the fused passes
        tuner._fused = variant != "plain"
        if variant == "untied":
            tuner.head_weight = tuner.head_weight.clone()  # a distinct W: the untied branch
        for i, sums in enumerate((None, gen_sum)):  # before the first token (S = 0), after
            probe = tuner.probe(ctx, (geo, sums))
            assert probe.loss_a is not None
            loss = probe.pooled.square().sum(-1) + 3.0 * probe.loss_a
            grads = torch.autograd.grad(loss.sum(), probe.deltas)
            results[variant, i] = (probe.loss_a.detach(), probe.pooled.detach(), grads)
    for (_, i), (loss_a, pooled, grads) in results.items():
        want = results["plain", i]
        torch.testing.assert_close(loss_a, want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pooled, want[1], rtol=1e-5, atol=1e-6)
        # sums in another order: within 1e-4 of the largest gradient (some are exactly 0)
        scale = max(float(ref.abs().max()) for ref in want[2])
        for got, ref in zip(grads, want[2]):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4 * scale)
    assert not torch.allclose(results["plain", 0][0], results["plain", 1][0])  # S entered ℓ̂_a

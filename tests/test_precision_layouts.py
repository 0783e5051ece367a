"""Every method on every precision and layout: the four tiny families in float32, bfloat16 and
float16, and OPT-350m's layout (`project_in` / `project_out`, post-norm blocks without a final
norm: `tiny-random/opt-proj`) and OPT with a final norm and projections (built from a config).

What breaks where a model's dtype or layout differs from the float32 GPT-2 shape: PPLM's Δ
meeting a half-precision cache, the pooled state of the attribute head (what the LM head
reads: after `project_out`), the float32 tuned path through `project_out`, θ's context sum
recomputed while the float32 copies are swapped in, and the whole CLI path."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from jobs.spec import JobSpec, ModelRef
from jobs.words import builtin_gender_words
from tests.cli_run import PAIR_FILES, run_here
from tests.helpers import step0_context
from workers.methods.base import StepContext
from workers.methods.biastune import bias_offsets, find_sites
from workers.methods.estimators import demographic_loss, demographic_scores, gender_geometry
from workers.methods.head_meta import known_hidden_size
from workers.methods.heads import lm_hidden_size, resolve_head
from workers.methods.tuner import BiasTuner
from workers.models import LoadedLM, load_lm

FAMILIES = ("gpt2", "opt", "falcon", "llama", "opt-proj", "gemma3")
DTYPES = ("float32", "bfloat16", "float16")
METHODS = (
    "vanilla",
    "uddia",
    "lidao-min",
    "lidao-prod",
    "elidao-min",
    "elidao-prod",
    "pplm",
    "gedi",
    "dexperts",
)
PROMPTS = ["The woman worked as a", "He said"]  # row 1 is left padded


@cache
def tiny(family: str, dtype: str = "float32") -> LoadedLM:
    """A tiny model, built once per module run (tests only read it)."""
    if family == "opt-pre":  # OPT with a final norm and projections in and out
        return _opt_variant(word_embed_proj_dim=32, do_layer_norm_before=True)
    if family == "opt-post":  # post-norm blocks, no final norm, no projection
        return _opt_variant(do_layer_norm_before=False)
    return load_lm(ModelRef(f"tiny-random/{family}", dtype=dtype), device="cpu")


def _opt_variant(**changes: Any) -> LoadedLM:
    """Tiny OPT with `changes` to its config, the tiny models' seed."""
    from transformers import OPTConfig, OPTForCausalLM

    from workers.tiny import TINY_SEED, tiny_config, tiny_tokenizer

    tok = tiny_tokenizer()
    config = tiny_config("opt", len(tok)).to_dict()
    config.update(changes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = OPTForCausalLM(OPTConfig(**config)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    ref = ModelRef("tiny-random/opt")
    return LoadedLM(ref, model, tok, torch.device("cpu"), "opt", builtin_gender_words())


def step0(lm: LoadedLM, hidden: bool = True) -> StepContext:
    jobs = [
        JobSpec(f"p{i}", p, "female", None, 0, "lidao-min", lm.ref, "sentiment")
        for i, p in enumerate(PROMPTS)
    ]
    return step0_context(lm, PROMPTS, jobs, hidden=hidden)


def fixed_head(width: int) -> nn.Linear:
    gen = torch.Generator().manual_seed(3)
    head = nn.Linear(width, 2)
    with torch.no_grad():
        head.weight.copy_(torch.rand(head.weight.shape, generator=gen) - 0.5)
        head.bias.zero_()
    return head


def loss_of(
    head: nn.Module, pooled: torch.Tensor, logits: torch.Tensor, loss_a: torch.Tensor
) -> torch.Tensor:
    """A head term on the pooled state, a term on θ's logits and 3 ℓ̂_a, per row."""
    labels = torch.zeros(pooled.shape[0], dtype=torch.long)
    ce = F.cross_entropy(head(pooled), labels, reduction="none")
    return ce + logits.logsumexp(-1) + 3.0 * loss_a


# ---- OPT's projections: where the LM head reads ------------------------------------------------


def test_opt_350m_layout_pools_after_project_out_and_tunes_the_blocks_only() -> None:
    lm = tiny("opt-proj")
    decoder = lm.model.model.decoder
    assert decoder.final_layer_norm is None and decoder.project_out is not None
    sites = find_sites(lm.model, 2)
    assert not sites.has_final_norm and sites.block_points == sites.points
    assert [p.name for p in sites.above] == ["model.decoder.project_out"]
    assert sites.pool.module is decoder.project_out and sites.pool.width == 32
    assert all(p.name.startswith("model.decoder.layers.") for p in sites.points)
    pre = find_sites(tiny("opt-pre").model, 2)
    assert [p.name for p in pre.above] == [
        "model.decoder.final_layer_norm",
        "model.decoder.project_out",
    ]
    assert pre.has_final_norm and pre.points[-1].module is pre.above[0].module
    assert pre.pool.module is tiny("opt-pre").model.model.decoder.project_out
    plain = find_sites(tiny("opt").model, 2)  # no projection: the final norm is read
    assert plain.pool is plain.points[-1] and plain.above == (plain.points[-1],)
    post = find_sites(tiny("opt-post").model, 2)  # nothing above the blocks: the last block
    assert post.above == () and post.pool.name == "model.decoder.layers.3"
    # heads are as wide as what the LM head reads, known before loading (config checks)
    assert known_hidden_size("tiny-random/opt-proj") == 32 == lm_hidden_size(lm)
    assert resolve_head(lm, "sentiment", None).hidden_size == 32


def test_a_pool_as_wide_as_the_lm_head_reads_or_a_named_error() -> None:
    """A layout this does not map (here: opt-350m without its `project_out`, so the last block
    gives 64-wide states to a 32-wide LM head) is refused naming the model and the pool."""
    import copy

    from workers.methods.base import MethodError

    lm = tiny("opt-proj")
    broken = copy.deepcopy(lm.model)
    broken.model.decoder.project_out = None
    other = LoadedLM(lm.ref, broken, lm.tokenizer, lm.device, lm.family, lm.words)
    with pytest.raises(MethodError, match=r"tiny-random/opt-proj reads 32-wide states, but "):
        BiasTuner(other, 2, "last")


def brute_force(
    lm: LoadedLM, ctx: StepContext, scope: str, head: nn.Module
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The probe's gradient and pooled state by definition, with plain autograd through whole
    forwards of the model: offsets on the top 2 blocks (and the final norm) at every position
    (`context`) or at the last position and the horizon only (`last`, θ's earlier states
    constants); the pooled state is the mean of what the LM head reads over the real positions
    and the horizon, whose input embedding is Eᵀ softmax(logits); ℓ̂_a = Σ_x p_θ(x) s_x."""
    geo = gender_geometry(lm)
    sites = find_sites(lm.model, 2)
    B, T = ctx.input_ids.shape
    deltas = [torch.zeros(B, p.width, requires_grad=True) for p in sites.points]
    mask, pos = ctx.attention_mask, ctx.position_ids
    kw: dict[str, Any] = {"attention_mask": mask, "use_cache": True}
    with torch.enable_grad():
        past, before = None, torch.zeros(())
        if scope == "last":  # θ over every position but the last, no offsets, no gradient
            with torch.no_grad(), bias_offsets(lm.model, sites, None) as theta:
                out = lm.model(input_ids=ctx.input_ids[:, :-1], position_ids=pos[:, :-1], **kw)
            past = out.past_key_values
            before = (theta.final_hidden[-1] * mask[:, :-1, None]).sum(1)
        first = T - 1 if scope == "last" else 0
        with bias_offsets(lm.model, sites, deltas) as state:
            out = lm.model(
                input_ids=ctx.input_ids[:, first:],
                position_ids=pos[:, first:],
                past_key_values=past,
                **kw,
            )
            read = state.final_hidden[-1]  # (B, T - first, D)
            logits = out.logits[:, -1]
            # every token's input embedding as the model's embedding module gives it (Gemma
            # scales its rows by √D)
            table = lm.model.get_input_embeddings()(torch.arange(logits.shape[-1])[None])[0]
            embeds = torch.softmax(logits, -1) @ table
            lm.model.base_model(
                inputs_embeds=embeds[:, None],
                attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], 1),
                position_ids=pos[:, -1:] + 1,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            horizon = state.final_hidden[-1][:, -1]
        total = before + (read * mask[:, first:, None]).sum(1) + horizon
        pooled = total / (mask.sum(-1, keepdim=True) + 1)
        scores = demographic_scores(geo, torch.zeros(B, geo.embed.shape[1]))
        loss = loss_of(head, pooled, logits, demographic_loss(torch.softmax(logits, -1), scores))
        grads = torch.autograd.grad(loss.sum(), deltas)
    return list(grads), pooled.detach()


@pytest.mark.parametrize("scope", ["context", "last"])
@pytest.mark.parametrize("family", ["opt-proj", "opt-pre", "opt-post", "gpt2", "gemma3"])
def test_the_probe_gradient_is_the_definitions_on_projected_layouts(
    family: str, scope: str
) -> None:
    """float32: the engine's probe (replayed lower blocks, θ's logits, fused vocabulary passes,
    ℓ̂_a)
    against `brute_force`, for OPT-350m's layout, OPT with a final norm and projections, OPT
    with post-norm blocks and nothing above them, and GPT-2 as a control. Same maths, other summation orders: float32 rounding apart."""
    lm = tiny(family)
    ctx = step0(lm)
    head = fixed_head(lm.model.get_output_embeddings().weight.shape[1])
    want, pooled = brute_force(lm, ctx, scope, head)
    tuner = BiasTuner(lm, 2, scope)
    with torch.enable_grad():
        probe = tuner.probe(ctx, (gender_geometry(lm), None))
        assert probe.loss_a is not None
        loss = loss_of(head, probe.pooled, probe.logits, probe.loss_a)
        got = torch.autograd.grad(loss.sum(), probe.deltas)
    torch.testing.assert_close(probe.pooled, pooled, rtol=1e-5, atol=1e-6)
    assert any(bool(w.abs().sum() > 0) for w in want)
    for point, g, w in zip(tuner.sites.points, got, want):
        # float32 rounding is relative to the largest terms: Gemma's norm after the MLP makes
        # down_proj's gradient ~80 where its other elements are ~0.05
        atol = 1e-6 * max(1.0, float(w.abs().max()))
        torch.testing.assert_close(g, w, rtol=1e-4, atol=atol, msg=point.name)


# ---- half precision ----------------------------------------------------------------------------

UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11}  # unit roundoff


def tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B,) total variation distance of two (B, V) log-prob tensors."""
    return 0.5 * (a.exp() - b.exp()).abs().sum(-1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_projected_half_precision_tunes_through_a_float32_project_out(dtype: str) -> None:
    """OPT-350m's layout in half precision: the tuned passes run `project_out` as its float32
    copy (the model's own never runs in them) and follow the same weights run in float32:
    per-row gradient within 2e-2 (bf16) / 5e-3 (fp16) relative L2 (measured ≤ 4.1e-3 /
    1.1e-3), ≥ 99.5% of the δ signs with |δ32| ≥ lr/2 (measured ≥ 99.94%), the tuned
    distribution within 5% of float32's move away from θ (measured 1.5% / 0.45%)."""
    from tests.precision import pair, stand_in_loss, tuning_step
    from tests.precision import step0 as precision_step0

    half, full = pair("opt-proj", dtype)
    own = half.model.model.decoder.project_out
    assert own.weight.dtype == getattr(torch, dtype)
    loss = stand_in_loss(half)
    ctx16, ctx32 = precision_step0(half), precision_step0(full)
    lr = 0.01
    for scope in ("context", "last"):
        tuner = BiasTuner(half, 3, scope)
        assert tuner.f32 is not None
        (copy,) = [m for _, name, m in tuner.f32.swaps if name == "project_out"]
        assert copy is not own and copy.weight.dtype == torch.float32
        seen: list[torch.dtype] = []
        hooks = [
            own.register_forward_hook(lambda m, a, o, seen=seen: seen.append(torch.float64)),
            copy.register_forward_hook(lambda m, a, o, seen=seen: seen.append(a[0].dtype)),
        ]  # (the model's own project_out must never run in the tuned passes)
        try:
            got = tuning_step(half, ctx16, scope, loss, lr, tuner=tuner)
        finally:
            for h in hooks:
                h.remove()
        assert seen and set(seen) == {torch.float32}, (scope, seen)
        ref = tuning_step(full, ctx32, scope, loss, lr)
        rel = (got.grad - ref.grad).norm(dim=-1) / ref.grad.norm(dim=-1)
        assert bool((rel <= (2e-2 if dtype == "bfloat16" else 5e-3)).all()), (scope, rel)
        sized = ref.delta(lr).abs() >= lr / 2
        same = torch.sign(got.delta(lr)) == torch.sign(ref.delta(lr))
        assert same[sized].float().mean().item() >= 0.995, scope
        move, error = tv(ref.tuned, ref.theta), tv(got.tuned, ref.tuned)
        assert bool((move > 1e-3).all()) and bool((error <= 0.05 * move).all()), (scope, error)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_half_precision_last_scope_pools_without_the_loops_hidden_states(
    family: str, dtype: str
) -> None:
    """`last` scope in half precision with a step context that carries no hidden states (hand-
    built contexts, unit tests): θ's context sum is recomputed while the float32 copies are
    swapped in. Its pooled state equals the one from the loop's hidden states to rounding
    (relative L2 ≤ 2 unit roundoffs; measured ≤ 1.2 for bf16, 1.1 for fp16), and the step
    goes on to the tuned distribution."""
    lm = tiny(family, dtype)
    pooled = []
    for hidden in (True, False):
        ctx = step0(lm, hidden=hidden)
        tuner = BiasTuner(lm, 2, "last")
        with torch.enable_grad():
            probe = tuner.probe(ctx)
            head = fixed_head(probe.pooled.shape[-1])
            no_la = torch.zeros(probe.pooled.shape[0])
            loss = loss_of(head, probe.pooled, probe.logits, no_la)
            deltas = tuner.step(probe, loss, torch.ones(2, dtype=torch.bool), 0.01)
        tuned = tuner.tuned_logits(ctx, deltas)
        assert bool(torch.isfinite(tuned).all()) and not torch.equal(tuned, ctx.logits)
        pooled.append(probe.pooled.detach())
    rel = (pooled[0] - pooled[1]).norm(dim=-1) / pooled[0].norm(dim=-1)
    assert bool((rel <= 2 * UNIT[dtype]).all()), rel


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_pplm_in_half_precision_follows_float32(family: str, dtype: str) -> None:
    """PPLM's Δ is optimised in float32 and meets the half-precision cache in its dtype (the
    perturbed history it keeps stays in the model's dtype). The perturbed distribution of
    step 0 (3 steps of 0.2) is within 15% of float32's move away from θ on the same weights
    (measured ≤ 4%; moves 0.003–0.04 in TV)."""
    from tests.precision import pair
    from tests.precision import step0 as precision_step0
    from workers.decoding import prompt_token_ids
    from workers.methods.registry import load_method, resolve_params

    found = {}
    for lm in pair(family, dtype):
        params = resolve_params("pplm", {"steps": 3, "step_size": 0.2}, lm.ref.id)
        method = load_method("pplm")(lm, params, "sentiment")
        ctx = precision_step0(lm)
        method.begin(ctx.jobs, [prompt_token_ids(lm, j.prompt) for j in ctx.jobs])
        found[lm.model.dtype] = (method.next_logprobs(ctx).detach(), ctx.process(ctx.logits))
        assert method._past is not None
        assert {t.dtype for kv in method._past for t in kv} == {lm.model.dtype}
    (half, half_theta), (full, full_theta) = found[getattr(torch, dtype)], found[torch.float32]
    move = tv(full, full_theta)
    assert bool((move > 1e-3).all()) and bool((tv(half, half_theta) > 1e-3).all())
    assert bool((tv(half, full) <= 0.15 * move).all()), (tv(half, full), move)


# ---- the whole path ----------------------------------------------------------------------------


@pytest.mark.slow
def test_every_method_on_every_family_and_dtype_through_harness_run(tmp_path: Path) -> None:
    """`python -m harness run` (in process, no Ray): the nine methods on the five tiny models
    (the four families and OPT-350m's layout) in float32, bfloat16 and float16, one prompt
    pair, 3 tokens: every job ok, in its dtype; UDDIA's redo recorded per row."""
    cfg = {
        "name": "precision-layouts",
        "dataset": {"kind": "paired-jsonl", "files": PAIR_FILES, "limit": 1},
        "models": [
            {"id": f"tiny-random/{f}", "dtype": d, "name": f"{f}-{d}"}
            for f in FAMILIES
            for d in DTYPES
        ],
        "methods": [
            "vanilla",
            {"name": "uddia", "params": {"blocks": 2, "redo": True}},
            {"name": "lidao-min", "params": {"blocks": 2, "scope": "last"}},
            {"name": "lidao-prod", "params": {"blocks": 2}},
            {"name": "elidao-min", "params": {"blocks": 2}},
            {"name": "elidao-prod", "params": {"blocks": 2, "scope": "last"}},
            {"name": "pplm", "params": {"steps": 2, "step_size": 0.02}},
            {
                "name": "gedi",
                "params": {
                    "gedi_model": "tiny-random/gpt2",
                    "code_desired": "good",
                    "code_undesired": "bad",
                },
            },
            {
                "name": "dexperts",
                "params": {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/opt"},
            },
        ],
        "tasks": ["sentiment"],
        "samples_per_prompt": 1,
        "generation": {"max_new_tokens": 3},
        "scorers": ["gender"],
    }
    gens = run_here(tmp_path, cfg)
    cells: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in gens.iter_rows(named=True):
        cells.setdefault((row["model"], row["model_dtype"], row["method"]), []).append(row)
    want = {(f"tiny-random/{f}", d, m) for f in FAMILIES for d in DTYPES for m in METHODS}
    assert set(cells) == want
    for cell, rows in cells.items():
        assert len(rows) == 2, cell
        assert all(r["status"] == "ok" for r in rows), (cell, [r["error"] for r in rows])
        if cell[2] == "uddia":
            for r in rows:
                eff = json.loads(r["effective_params"])
                assert 1 <= eff["redo_kept"] <= eff["redo_tries"] == len(eff["redo_ppl"])

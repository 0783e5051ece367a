"""Bias-tuning engine: work not recomputed, half precision, models split across devices."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json
from tests.precision import PROMPTS as PRECISION_PROMPTS
from tests.precision import UNIT, noise_floor, pair, stand_in_loss, step0, tuning_step
from workers.decoding import decode_batch, loop_cache
from workers.methods import tuner as tuner_module
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM, load_lm

FAMILIES = ("gpt2", "opt", "falcon", "llama", "gemma3")
PROMPTS = ["The woman worked as a", "He said that the man was", "My sister is a"]


def jobs_for(lm: LoadedLM, method: str, params: dict[str, Any], tokens: int) -> list[JobSpec]:
    gen = GenerationParams(max_new_tokens=tokens)
    resolved = canonical_json(resolve_params(method, params, lm.ref.id))
    return [
        JobSpec(f"p{i}", p, "female", None, 3, method, lm.ref, "sentiment", gen, resolved)
        for i, p in enumerate(PROMPTS)
    ]


def generate(
    lm: LoadedLM, method: str, params: dict[str, Any], tokens: int
) -> list[dict[str, Any]]:
    jobs = jobs_for(lm, method, params, tokens)
    built = load_method(method)(lm, jobs[0].params(), "sentiment")
    return decode_batch(lm, built, jobs)


# ---- what θ fixes is computed once -----------------------------------------------------------


def positions_per_step(scope: str, module: Callable[[LoadedLM], nn.Module]) -> list[int]:
    """lidao-min with 2 of the 4 blocks of tiny GPT-2 tuned, 6 tokens: the positions (summed
    over rows) that `module(lm)` computes between the start of one step and the next, counted
    inside a block (a replayed block is called but computes nothing)."""
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    jobs = jobs_for(lm, "lidao-min", {"scope": scope, "blocks": 2}, 6)
    method = load_method("lidao-min")(lm, jobs[0].params(), "sentiment")
    calls: list[int] = []  # positions per forward, summed over rows
    steps: list[int] = []  # forwards so far, at the start of each step
    handle = module(lm).register_forward_pre_hook(
        lambda m, args: calls.append(args[0].shape[:2].numel())
    )
    original = method.next_logprobs
    method.next_logprobs = lambda ctx: (steps.append(len(calls)), original(ctx))[1]  # type: ignore[method-assign]
    try:
        rows = decode_batch(lm, method, jobs)
    finally:
        handle.remove()
    assert all(r["status"] == "ok" for r in rows) and len(steps) == 6
    return [calls[0], *(sum(calls[a:b]) for a, b in zip(steps, [*steps[1:], len(calls)]))]


def prompt_width() -> int:
    """The padded prompt width of PROMPTS under tiny GPT-2: the longest prompt + BOS."""
    tok = load_lm(ModelRef("tiny-random/gpt2"), device="cpu").tokenizer
    return max(len(tok(p)["input_ids"]) + 1 for p in PROMPTS)


@pytest.mark.parametrize("scope", ["context", "last"])
def test_lower_blocks_see_each_position_once_plus_the_horizon(scope: str) -> None:
    """Block 0 (below the 2 tuned blocks of 4) runs the prompt once, then per step only the
    loop's new position and the horizon position: never the context again."""
    prefill, *per_step = positions_per_step(scope, lambda lm: lm.model.transformer.h[0].ln_1)
    B, S = len(PROMPTS), len(per_step)
    assert prefill == B * prompt_width()
    # between two steps: the horizon of the step (B) and the loop's next token (B)
    assert per_step == [2 * B] * (S - 1) + [B]


# ---- half precision ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, dtype",
    [(f, "bfloat16") for f in FAMILIES] + [(f, "float16") for f in ("opt", "llama")],
)
def test_half_precision_offsets_follow_the_float32_computation(family: str, dtype: str) -> None:
    """The tuned path of a half-precision model (float32 tuned blocks) against the same weights
    run in float32, step 0, both scopes (docs/design.md, precision policy).

    δ signs agree on ≥ 99.9% of the elements above the noise floor: |g32| ≥ 3σ, σ the spread
    of the float32 gradient over 6 runs whose lower-block activations carry rounding-sized
    noise (those blocks stay in the model's dtype, so an element within σ has its sign set by
    θ's own rounding). The floor must keep ≥ 90% of the elements with |δ32| ≥ lr/2 (measured:
    96–100%), and the tuned distribution is within 10% of float32's move away from θ (TV).
    """
    half, full = pair(family, dtype)
    loss = stand_in_loss(half)
    ctx16, ctx32 = step0(half), step0(full)
    lr = 0.01
    for scope in ("context", "last"):
        ref = tuning_step(full, ctx32, scope, loss, lr)
        got = tuning_step(half, ctx16, scope, loss, lr)
        assert got.grad.dtype == torch.float32
        floor = noise_floor(full, PRECISION_PROMPTS, scope, loss, UNIT[dtype], draws=6)
        sized = ref.delta(lr).abs() >= lr / 2
        above = sized & (ref.grad.abs() >= 3 * floor)
        assert int(above.sum()) >= 0.9 * int(sized.sum()), (scope, int(above.sum()))
        same = torch.sign(got.delta(lr)) == torch.sign(ref.delta(lr))
        agree = same[above].float().mean().item()
        assert agree >= 0.999, (scope, agree, int((~same & above).sum()))
        move = 0.5 * (ref.tuned.exp() - ref.theta.exp()).abs().sum(-1)  # (B,) TV(θ_t, θ)
        error = 0.5 * (got.tuned.exp() - ref.tuned.exp()).abs().sum(-1)
        assert bool((move > 1e-3).all()) and bool((error <= 0.1 * move).all()), (scope, error, move)


def test_half_precision_leaves_the_model_in_its_dtype() -> None:
    lm = load_lm(ModelRef("tiny-random/llama", dtype="bfloat16"), device="cpu")
    names = {n: type(m) for n, m in lm.model.named_modules()}
    rows = generate(lm, "lidao-min", {"blocks": 2}, 3)
    assert all(r["status"] == "ok" and r["num_tokens"] > 0 for r in rows)
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    assert {n: type(m) for n, m in lm.model.named_modules()} == names


def test_flash_attention_with_half_precision_tuning_is_refused_by_name() -> None:
    from workers.methods.base import MethodError

    lm = load_lm(ModelRef("tiny-random/llama", dtype="bfloat16"), device="cpu")
    lm.model.config._attn_implementation = "flash_attention_2"  # as a config would load it
    with pytest.raises(MethodError, match=r"flash_attention_2 does not take; load tiny-random"):
        tuner_module.BiasTuner(lm, 2, "context")
    lm.model.config._attn_implementation = "sdpa"
    assert tuner_module.BiasTuner(lm, 2, "context").f32 is not None


def test_half_precision_tuners_of_one_model_share_their_float32_copies() -> None:
    lm = load_lm(ModelRef("tiny-random/llama", dtype="bfloat16"), device="cpu")
    deep = tuner_module.BiasTuner(lm, 2, "context")
    again = tuner_module.BiasTuner(lm, 2, "last")  # another method on the same model
    shallow = tuner_module.BiasTuner(lm, 1, "context")  # UDDIA's redo with fewer blocks
    assert deep.f32 is not None and again.f32 is not None and shallow.f32 is not None
    copies = [module for _, _, module in deep.f32.swaps]
    assert [m for _, _, m in again.f32.swaps] == copies  # the same modules, not equal ones
    assert [m for _, _, m in shallow.f32.swaps] == copies[1:]  # the top block and final norm
    assert again.head_weight is deep.head_weight and deep.head_weight.dtype == torch.float32
    other = load_lm(ModelRef("tiny-random/llama", dtype="bfloat16"), device="cpu")
    assert tuner_module.BiasTuner(other, 2, "context").f32.swaps[0][2] is not copies[0]  # per model
    rows = generate(lm, "lidao-min", {"blocks": 2}, 3)  # the shared copies decode
    assert all(r["status"] == "ok" and r["num_tokens"] > 0 for r in rows)


@pytest.mark.parametrize("family", ["opt", "llama"])
def test_half_precision_keeps_float32_keys_and_values_step_to_step(family: str) -> None:
    """`last` scope in bf16: the tuned blocks' float32 K/V of θ, recomputed once per batch and
    then grown by each probe, equal a recomputation at every step (same tokens and losses)."""
    lm = load_lm(ModelRef(f"tiny-random/{family}", dtype="bfloat16"), device="cpu")
    params = {"scope": "last", "blocks": 2}
    jobs = jobs_for(lm, "lidao-min", params, 5)
    grown = decode_batch(lm, load_method("lidao-min")(lm, jobs[0].params(), "sentiment"), jobs)
    method = load_method("lidao-min")(lm, jobs[0].params(), "sentiment")
    original = method.next_logprobs
    kept: list[int] = []

    def fresh(ctx: Any) -> Any:
        kv = method.tuner.rerun.kv32
        kept.append(-1 if kv is None else kv[0][0].shape[-2])
        method.tuner.rerun.kv32 = None  # force the recomputation from the cached block inputs
        return original(ctx)

    method.next_logprobs = fresh  # type: ignore[method-assign]
    again = decode_batch(lm, method, jobs)
    assert kept[0] == -1 and kept[1:] == list(range(kept[1], kept[1] + len(kept) - 1))
    for a, b in zip(grown, again):
        assert a["status"] == b["status"] == "ok"
        assert a["token_ids"] == b["token_ids"]
        torch.testing.assert_close(a["loss_g"], b["loss_g"], rtol=1e-5, atol=1e-6)


# ---- models split across devices -----------------------------------------------------------


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_moved(v, device) for v in value)
    return value


def _device_forward(module: nn.Module, device: torch.device) -> Callable[..., Any]:
    plain = type(module).forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        moved = {k: _moved(v, device) for k, v in kwargs.items()}
        return plain(module, *_moved(args, device), **moved)

    return forward


def split(model: nn.Module, device_map: dict[str, str]) -> None:
    """Place each named module on its device, with an instance `forward` that moves its inputs
    there first: what accelerate's `dispatch_model` does for a `device_map`."""
    for name, device in device_map.items():
        module = model.get_submodule(name)
        module.to(device)
        vars(module)["forward"] = _device_forward(module, torch.device(device))


def _split_lm(device: str) -> tuple[LoadedLM, LoadedLM, list[nn.Module]]:
    plain = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    model = copy.deepcopy(plain.model)
    blocks = {f"transformer.h.{i}": ("cpu" if i < 2 else device) for i in range(4)}
    split(model, {**blocks, "transformer.ln_f": device, "lm_head": "cpu"})
    lm = LoadedLM(plain.ref, model, plain.tokenizer, plain.device, plain.family, plain.words)
    return plain, lm, [model.get_submodule(n) for n in blocks]


def _check_split(device: str, exact: bool) -> None:
    plain, lm, blocks = _split_lm(device)
    wrappers = [vars(b)["forward"] for b in blocks]
    for method, scope in (("lidao-min", "context"), ("elidao-prod", "last")):
        params = {"scope": scope, "blocks": 2}
        want = generate(plain, method, params, 5)
        got = generate(lm, method, params, 5)
        assert all(r["status"] == "ok" for r in got)
        for a, b in zip(got, want):
            if exact:
                assert a["token_ids"] == b["token_ids"]
            torch.testing.assert_close(a["loss_g"][:1], b["loss_g"][:1], rtol=1e-4, atol=1e-5)
    # replaying the lower blocks keeps the device wrappers in place
    assert [vars(b)["forward"] for b in blocks] == wrappers


def test_split_model_path_on_cpu_devices() -> None:
    """The device-map code path with every entry on the CPU: runs in CI, exact tokens."""
    _check_split("cpu", exact=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_model_between_cuda_and_cpu() -> None:
    """The top blocks and the final norm on cuda:0, the rest on the CPU."""
    _check_split("cuda:0", exact=False)


# ---- the probe differentiates θ's own forward ------------------------------------------------


@pytest.mark.parametrize("scope", ["context", "last"])
def test_tuned_blocks_see_the_new_position_the_horizon_and_the_tuned_pass(scope: str) -> None:
    """The first tuned block (2 of 4) runs, per step, the loop's new position, the horizon and
    the tuned last position; in `last` scope the probe reuses θ's forward of the new position
    (after the prompt's step), in `context` scope it re-runs the context's T positions."""
    _, *per_step = positions_per_step(scope, lambda lm: lm.model.transformer.h[2].ln_1)
    B, S, width = len(PROMPTS), len(per_step), prompt_width()
    if scope == "last":  # the prompt's positions are constants: its probe re-runs the last one
        want = [4 * B] + [3 * B] * (S - 2) + [2 * B]
    else:
        want = [B * (width + s) + 3 * B for s in range(S - 1)] + [B * (width + S - 1) + 2 * B]
    assert per_step == want


def products_per_step(scope: str) -> tuple[list[int], list[int]]:
    """lidao-min as in `positions_per_step`: the rows multiplied by the weight of block 2's
    `attn.c_attn` (the first tuned block), per step, in forward products (the weight as
    stored: GPT-2's Conv1D computes x W) and in backward products (Wᵀ)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    weight = lm.model.transformer.h[2].attn.c_attn.weight
    jobs = jobs_for(lm, "lidao-min", {"scope": scope, "blocks": 2}, 6)
    method = load_method("lidao-min")(lm, jobs[0].params(), "sentiment")
    forward: list[int] = []
    backward: list[int] = []
    steps: list[tuple[int, int]] = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
                mats = [a for a in args if isinstance(a, torch.Tensor) and a.ndim == 2][-2:]
                for i, mat in enumerate(mats):
                    if (
                        mat.data_ptr() == weight.data_ptr()
                        and mat.shape[0] * mat.shape[1] == weight.numel()
                    ):
                        rows = mats[1 - i].shape[0]
                        (forward if mat.stride() == weight.stride() else backward).append(rows)
            return func(*args, **(kwargs or {}))

    original = method.next_logprobs

    def marked(ctx: Any) -> torch.Tensor:
        steps.append((len(forward), len(backward)))
        return original(ctx)

    method.next_logprobs = marked  # type: ignore[method-assign]
    with Products():
        rows = decode_batch(lm, method, jobs)
    assert all(r["status"] == "ok" for r in rows) and len(steps) == 6
    ends = [*steps[1:], (len(forward), len(backward))]
    fwd = [sum(forward[a[0] : b[0]]) for a, b in zip(steps, ends)]
    bwd = [sum(backward[a[1] : b[1]]) for a, b in zip(steps, ends)]
    return fwd, bwd


def test_context_scope_replays_thetas_linear_outputs_over_the_context() -> None:
    """`context` scope, float32: the probe re-runs the tuned blocks over the context, but their
    linear layers return θ's recorded outputs (`_Replay`), so a tuned weight multiplies, per
    step, only the loop's new position, the horizon and the tuned last position (B rows
    each), while the backward still covers every position of the context and the horizon."""
    fwd, bwd = products_per_step("context")
    B, S, width = len(PROMPTS), 6, prompt_width()
    assert fwd == [3 * B] * (S - 1) + [2 * B]
    assert bwd == [B * (width + s) + B for s in range(S)]


def _teacher_forced_steps(
    lm: LoadedLM, scope: str, steps: int
) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Per step of a teacher-forced decode (greedy tokens of θ): the gradients of one loss from
    the probe that reuses θ's forward (`theta_forward`) and from the probe that re-runs it."""
    from workers.decoding import left_padded, prompt_token_ids
    from workers.methods.base import StepContext
    from workers.methods.estimators import gender_geometry
    from workers.methods.tuner import BiasTuner

    reuse, rerun = BiasTuner(lm, 2, scope), BiasTuner(lm, 2, scope)
    B = len(PROMPTS)
    reuse.begin(B)
    ids, mask = left_padded(lm, [prompt_token_ids(lm, p) for p in PROMPTS])
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    geo = gender_geometry(lm)
    torch.manual_seed(5)
    head = nn.Linear(lm.model.config.hidden_size, 2)
    gen_sum: torch.Tensor | None = None

    def theta(new: torch.Tensor, cache: Any) -> Any:
        """The loop's forward of θ over the `new` ids (inside the reusing tuner's context)."""
        with reuse.theta_forward(B):
            return lm.model(
                input_ids=new,
                attention_mask=mask,
                position_ids=pos[:, -new.shape[1] :],
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=True,
                logits_to_keep=1,
            )

    out = theta(ids, loop_cache(lm))
    found = []
    for step in range(steps):
        ctx = StepContext(
            model=lm.model,
            step=step,
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=out.past_key_values,
            logits=out.logits[:, -1].detach().float(),
            hidden_states=tuple(h.detach() for h in out.hidden_states),
            active=torch.ones(B, dtype=torch.bool),
            jobs=[],
            process=lambda z: torch.log_softmax(z, dim=-1),
        )
        grads = []
        for tuner in (reuse, rerun):
            probe = tuner.probe(ctx, (geo, gen_sum))
            if scope == "last":
                reused = tuner is reuse and step > 0
                assert (probe.deltas is reuse.theta_graph.zeros) == reused
            else:
                assert tuner.replayed == (tuner is reuse)
            assert probe.loss_a is not None
            labels = torch.zeros(B, dtype=torch.long)
            loss = (
                nn.functional.cross_entropy(head(probe.pooled), labels, reduction="none")
                + 3.0 * probe.loss_a
                + probe.logits.logsumexp(-1)
            )
            grads.append(list(torch.autograd.grad(loss.sum(), probe.deltas, retain_graph=True)))
        found.append((grads[0], grads[1]))
        tokens = ctx.logits.argmax(-1)
        embeds = geo.embed[tokens].float()
        gen_sum = embeds if gen_sum is None else gen_sum + embeds
        ids = torch.cat([ids, tokens[:, None]], dim=-1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        pos = torch.cat([pos, pos[:, -1:] + 1], dim=-1)
        out = theta(tokens[:, None], out.past_key_values)
    return found


@pytest.mark.parametrize("scope", ["last", "context"])
@pytest.mark.parametrize("family", FAMILIES)
def test_reusing_thetas_forward_gives_the_rerun_gradients_at_every_step(
    family: str, scope: str
) -> None:
    """Four teacher-forced steps. `last` scope: the probe over θ's own forward (its graph cut
    before the next forward) against the probe that re-runs the tuned blocks on the last
    position. `context` scope: the re-run of the context whose linear layers replay θ's
    recorded outputs against the plain re-run. Same gradients to float32 rounding (summation
    orders differ)."""
    lm = load_lm(ModelRef(f"tiny-random/{family}"), device="cpu")
    for step, (got, want) in enumerate(_teacher_forced_steps(lm, scope, 4)):
        assert any(bool(w.abs().sum() > 0) for w in want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6, msg=f"step {step}")

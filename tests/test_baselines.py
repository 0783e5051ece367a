"""The paper's baselines (PPLM, GeDi, DExperts) on tiny models, through the shared decoding loop."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef
from tests.agreement import assert_alone_matches_batched, assert_same_samples, traced
from tests.helpers import step0_context
from workers.decoding import decode_batch
from workers.methods.base import DecodingMethod, MethodError, StepContext
from workers.methods.dexperts import DExperts, ensemble, nucleus_filter
from workers.methods.experts import load_extra_lm
from workers.methods.gedi import class_head, desired_logprob, gedi_filter
from workers.methods.heads import AttributeHead
from workers.methods.pplm import PPLM, window_mask
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM, load_lm
from workers.tiny import build_tiny_lm

PROMPTS = ["the doctor said that she", "he is a", "my mother was very"]
GEN = GenerationParams(max_new_tokens=6, temperature=0.8, repetition_penalty=1.2)
GEN_PLAIN = GenerationParams(max_new_tokens=5, temperature=0.8)  # process = log_softmax(z / 0.8)
GEDI_TEST = {"gedi_model": "tiny-random/gpt2", "code_desired": "good", "code_undesired": "bad"}


@pytest.fixture(scope="module")
def lm() -> LoadedLM:
    return load_lm(ModelRef("tiny-random/gpt2"), device="cpu")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Saved tiny GPT-2 variants: an expert that favours 'happy', one with another tokenizer."""
    root = tmp_path_factory.mktemp("models")
    model, tok = build_tiny_lm("tiny-random/gpt2")
    favoured = tok.convert_tokens_to_ids("happy")
    with torch.no_grad():  # final hidden states lean toward 'happy's output embedding
        wte = model.transformer.wte.weight
        model.transformer.ln_f.bias += 10.0 * wte[favoured] / wte[favoured].norm()
    model.save_pretrained(root / "expert")
    tok.save_pretrained(root / "expert")
    model, tok = build_tiny_lm("tiny-random/gpt2")
    tok.add_tokens(["zebra"])
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(root / "other-tokenizer")
    tok.save_pretrained(root / "other-tokenizer")
    return {"expert": str(root / "expert"), "other": str(root / "other-tokenizer")}


def make_jobs(
    lm: LoadedLM,
    method: str,
    params: dict[str, Any],
    prompts: list[str],
    gen: GenerationParams = GEN,
) -> list[JobSpec]:
    resolved = json.dumps(resolve_params(method, params, lm.ref.id), sort_keys=True)
    return [
        JobSpec(f"t:{i}", text, "female", None, 1, method, lm.ref, "sentiment", gen, resolved)
        for i, text in enumerate(prompts)
    ]


def build(
    lm: LoadedLM, method: str, params: dict[str, Any], task: str = "sentiment"
) -> DecodingMethod:
    return load_method(method)(lm, resolve_params(method, params, lm.ref.id), task)  # type: ignore[no-any-return]


def run(
    lm: LoadedLM, method: str, params: dict[str, Any], prompts: list[str] = PROMPTS
) -> list[list[int]]:
    rows = decode_batch(lm, build(lm, method, params), make_jobs(lm, method, params, prompts))
    assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
    return [r["token_ids"] for r in rows]


def prefill(lm: LoadedLM, prompts: list[str], method: DecodingMethod) -> StepContext:
    """The StepContext of step 0 as the loop builds it (left padding, hidden states)."""
    jobs = make_jobs(lm, "vanilla", {}, prompts)
    method.begin(jobs, [])
    return step0_context(lm, prompts, jobs, hidden=True)


class Recording:
    """Wraps a method's `next_logprobs` to keep each step's inputs and output."""

    def __init__(self, method: DecodingMethod) -> None:
        self.steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        inner: Callable[[StepContext], torch.Tensor] = method.next_logprobs

        def wrapped(ctx: StepContext) -> torch.Tensor:
            out = inner(ctx)
            self.steps.append(
                (ctx.input_ids.clone(), ctx.attention_mask.clone(), out.detach().clone())
            )
            return out

        method.next_logprobs = wrapped  # type: ignore[method-assign]


def full_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits of a cache-free forward of left-padded ids."""
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()  # type: ignore[no-any-return]


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
    # Same uniforms (common random numbers); distributions equal within rounding, since the
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
        # are row-wise (test_method_filters_are_row_wise) but a probability within rounding of
        # the cut may fall either side when the batch shape changes the rounding.
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
    rows = assert_alone_matches_batched(
        lm, build(lm, method, params), make_jobs(lm, method, params, PROMPTS)
    )
    assert [r["token_ids"] for r in rows] != run(lm, "vanilla", {})  # the method is active


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


def test_filter_cuts_break_exact_ties_by_token_id_in_any_batch() -> None:
    """At a cut through exactly tied tokens, GeDi drops the higher ids first (ranking by
    desirability, then id, as the sampler ranks) and DExperts keeps the lower ids: the same
    tokens alone, at any row of any batch, beside rows of any content."""
    V = 600  # above the sizes where a sort may fall back to a simple (stable) loop
    scores = torch.zeros(V)  # every token holds 1/V of the mass
    desired = torch.full((V,), math.log(0.5))
    desired[::2] = math.log(0.9)  # even ids are desirable (above target_p), odd ids tie below
    desired[1] = math.log(0.1)  # the least desirable token
    # filter_p = 0.2495 (cut far from a rounding boundary): the cumulative mass stays below it
    # for 149 tokens; 1, then the 148 highest odd ids (tied)
    want = torch.zeros(V, dtype=torch.bool)
    want[1] = True
    want[torch.arange(V - 1, 0, -2)[:148]] = True
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 3, 8):
        for row in range(batch):
            s = torch.randn(batch, V, generator=gen)
            d = torch.log_softmax(torch.randn(batch, V, generator=gen), -1)
            s[row], d[row] = scores, desired
            dropped = gedi_filter(s, d, 0.2495, 0.8)[row] < -5000
            assert torch.equal(dropped, want), (batch, row)
            # DExperts' nucleus: 0.1005 of a flat row keeps the 61 lowest ids
            kept = torch.isfinite(nucleus_filter(s, 0.1005)[row])
            assert torch.equal(kept.nonzero().flatten(), torch.arange(61)), (batch, row)


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


# --- PPLM --------------------------------------------------------------------------------------


def test_window_mask_keeps_the_most_recent_positions() -> None:
    cpu = torch.device("cpu")
    assert window_mask(5, 0, False, cpu).flatten().tolist() == [1.0] * 5
    assert window_mask(5, 2, False, cpu).flatten().tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert window_mask(5, 2, True, cpu).flatten().tolist() == [0.0, 0.0, 0.0, 0.5, 1.0]
    assert window_mask(2, 4, False, cpu).flatten().tolist() == [1.0, 1.0]


def _pplm_toward(
    lm: LoadedLM, token: str, steps: int, step_size: float
) -> tuple[PPLM, torch.Tensor]:
    """A PPLM whose head prefers final hidden states along the input embedding of `token`."""
    method = build(lm, "pplm", {"steps": steps, "step_size": step_size})
    assert isinstance(method, PPLM)
    emb = lm.model.get_input_embeddings().weight.detach()
    u = emb[lm.tokenizer.convert_tokens_to_ids(token)]
    u = u / u.norm()
    head = AttributeHead(emb.shape[1], ["positive", "negative"], 0, {"source": "constructed"})
    with torch.no_grad():
        head.linear.weight.copy_(10 * torch.stack([u, -u]))
        head.linear.bias.zero_()
    method.head = method.perturber.head = head
    return method, emb @ u  # (V,) how much each token's embedding points the preferred way


@pytest.mark.parametrize(("steps", "step_size"), [(3, 0.02), (10, 0.2)])
def test_pplm_moves_the_next_token_distribution_toward_the_heads_class(
    lm: LoadedLM, steps: int, step_size: float
) -> None:
    method, score = _pplm_toward(lm, "happy", steps, step_size)
    ctx = prefill(lm, PROMPTS, method)
    pplm = method.next_logprobs(ctx).exp()
    vanilla = torch.softmax(ctx.logits, -1)
    assert torch.allclose(pplm.sum(-1), torch.ones(len(PROMPTS)), atol=1e-5)
    assert bool(
        ((pplm @ score) > (vanilla @ score)).all()
    )  # expected preference rises in every row


def test_pplm_gradient_steps_lower_the_head_loss(lm: LoadedLM) -> None:
    method, _ = _pplm_toward(lm, "happy", 4, 0.05)
    ctx = prefill(lm, PROMPTS, method)
    traces: list[list[torch.Tensor]] = []
    run_inner = method.perturber.run

    def keep(s: Any) -> Any:
        out = run_inner(s)
        traces.append(out[2])
        return out

    method.perturber.run = keep  # type: ignore[method-assign]
    method.next_logprobs(ctx)
    (trace,) = traces
    assert len(trace) == 4 and bool((trace[-1] < trace[0]).all())
    assert method.row_columns(0)["loss_g"] == [pytest.approx(float(trace[0][0]))]


def test_pplm_persists_the_perturbed_history(lm: LoadedLM) -> None:
    method = build(lm, "pplm", {"steps": 2})
    recording = Recording(method)
    jobs = make_jobs(lm, "pplm", {"steps": 2}, PROMPTS[:1])
    assert isinstance(method, PPLM)
    at_end: list[Any] = []
    real_end = method.end

    def end() -> None:
        at_end.append(method._past)
        real_end()

    method.end = end  # type: ignore[method-assign]
    decode_batch(lm, method, jobs)
    (past,) = at_end
    assert past is not None and method._past is None  # dropped once the batch's rows exist
    ids = recording.steps[-1][0]
    assert past[0][0].shape[2] == ids.shape[1]  # history + the last fed token
    clean = lm.model(input_ids=ids, use_cache=True).past_key_values.layers[0].keys
    assert not torch.allclose(past[0][0], clean, atol=1e-4)


def test_pplm_rejects_bad_parameters_and_falls_back_to_family_steps(lm: LoadedLM) -> None:
    with pytest.raises(ValueError, match="horizon_length = 0: must be in"):  # config validation
        resolve_params("pplm", {"horizon_length": 0}, lm.ref.id)
    with pytest.raises(MethodError, match="horizon_length >= 1"):  # the method's own check
        load_method("pplm")(lm, {**resolve_params("pplm", {}, lm.ref.id), "horizon_length": 0}, "x")
    assert build(lm, "pplm", {}).effective_params()["steps"] == 10
    falcon = load_lm(ModelRef("tiny-random/falcon"), device="cpu")
    assert build(falcon, "pplm", {}).effective_params()["steps"] == 3
    assert resolve_params("pplm", {}, "tiiuae/falcon-7b-instruct")["steps"] == 3


# --- DExperts ----------------------------------------------------------------------------------


def test_nucleus_filter_keeps_the_smallest_set_above_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(nucleus_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.equal(nucleus_filter(logits, 1.0), logits)
    out = ensemble(logits, torch.zeros(1, 4), torch.tensor([[0.0, 0.0, 0.0, -1.0]]), 2.0, 0.7)
    assert out[0, 3] == float("-inf") and out[0, 0] == logits[0, 0]


def test_dexperts_steps_equal_the_published_formula(lm: LoadedLM, models: dict[str, str]) -> None:
    params = {"expert": models["expert"], "anti_expert": "tiny-random/gpt2", "alpha": 1.5}
    method = build(lm, "dexperts", params)
    assert isinstance(method, DExperts)
    rec = Recording(method)
    decode_batch(lm, method, make_jobs(lm, "dexperts", params, PROMPTS, GEN_PLAIN))
    expert, anti = method.expert.lm.model, method.anti.lm.model
    assert len(rec.steps) == GEN_PLAIN.max_new_tokens
    for ids, mask, got in rec.steps:  # every step, recomputed without caches
        z_base, z_exp, z_anti = (full_logits(m, ids, mask)[:, -1] for m in (lm.model, expert, anti))
        want = torch.log_softmax(ensemble(z_base, z_exp, z_anti, 1.5, 0.9) / 0.8, -1)
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(got)) and bool((~finite).any())
        assert torch.allclose(got[finite], want[finite], atol=1e-4)


def test_dexperts_shifts_probability_to_what_the_expert_favours(
    lm: LoadedLM, models: dict[str, str]
) -> None:
    happy = lm.tokenizer.convert_tokens_to_ids("happy")
    params = {
        "expert": models["expert"],
        "anti_expert": "tiny-random/gpt2",
        "alpha": 2.0,
        "filter_p": 1.0,
    }
    method = build(lm, "dexperts", params)
    ctx = prefill(lm, PROMPTS, method)
    boosted, vanilla = method.next_logprobs(ctx), torch.log_softmax(ctx.logits, -1)
    assert bool((boosted[:, happy] > vanilla[:, happy] + 1.0).all())
    assert bool(((boosted - vanilla).argmax(-1) == happy).all())


# --- GeDi --------------------------------------------------------------------------------------


def test_gedi_posterior_is_bayes_rule_with_length_normalisation() -> None:
    lp = torch.log(torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]]))  # (2 classes, 1 row, 2 tokens)
    none = torch.zeros(2, 1)
    got = desired_logprob(lp, none, torch.zeros(1), 1.0, torch.zeros(2), 0.0).exp()
    assert torch.allclose(got, torch.tensor([[0.9, 0.1]]))
    prior = torch.log(torch.tensor([[0.2], [0.8]]))  # one earlier token, likelier undesired
    got = desired_logprob(lp, prior, torch.ones(1), 1.0, torch.zeros(2), 0.0)
    want = torch.log_softmax(
        torch.stack([(prior[0] + lp[0, 0]) / 2, (prior[1] + lp[1, 0]) / 2]), 0
    )[0]
    assert torch.allclose(got[0], want)
    biased = desired_logprob(lp, none, torch.zeros(1), 1.0, torch.zeros(2), 2.0)
    assert torch.allclose(
        biased - torch.log1p(-biased.exp()),
        got.new_tensor([[2.0 + 2.1972, 2.0 - 2.1972]]),
        atol=1e-3,
    )


def test_gedi_filter_removes_only_unlikely_undesirable_tokens() -> None:
    scores = torch.log(torch.tensor([[0.05, 0.05, 0.6, 0.3]]))
    logp_desired = torch.log(torch.tensor([[0.1, 0.95, 0.5, 0.2]]))
    out = gedi_filter(scores, logp_desired, filter_p=0.5, target_p=0.8)
    # least desirable first: token 0 (cum .05), 3 (.35), 2 (.95): 0 and 3 go; token 1 is above target_p
    assert (out < -1000).tolist() == [[True, False, False, True]]


def test_gedi_steps_match_a_cache_free_recomputation(lm: LoadedLM) -> None:
    params = {**GEDI_TEST, "filter_p": 0.0, "disc_weight": 5.0}
    method = build(lm, "gedi", params)
    rec = Recording(method)
    decode_batch(lm, method, make_jobs(lm, "gedi", params, PROMPTS, GEN_PLAIN))
    codes = [lm.tokenizer.convert_tokens_to_ids(c) for c in ("good", "bad")]
    assert len(rec.steps) == GEN_PLAIN.max_new_tokens
    for ids, mask, got in rec.steps:
        per_class = []
        for code in codes:  # log p(tokens | code) length-normalised, one unpadded row at a time
            rows = []
            for i in range(ids.shape[0]):
                seq = torch.tensor([[code] + ids[i][mask[i].bool()].tolist()])
                lp = torch.log_softmax(full_logits(lm.model, seq, torch.ones_like(seq))[0], -1)
                prior = lp[:-1].gather(-1, seq[0, 1:].unsqueeze(-1)).sum()
                rows.append((prior + lp[-1]) / seq.shape[1])
            per_class.append(torch.stack(rows))
        logp_desired = torch.log_softmax(torch.stack(per_class), 0)[0]
        base = full_logits(lm.model, ids, mask)[:, -1]
        want = torch.log_softmax((base + 5.0 * logp_desired) / 0.8, -1)
        assert torch.allclose(got, want, atol=1e-4)


def test_gedi_reads_logit_scale_and_class_bias_from_the_checkpoint(
    lm: LoadedLM, tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    model, tok = build_tiny_lm("tiny-random/gpt2")
    model.config.logit_scale, model.config.nbias = True, 2
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    gedi = load_lm(ModelRef(str(tmp_path)), device="cpu")
    with pytest.raises(MethodError, match="declares logit_scale / nbias"):
        class_head(gedi)
    state = load_file(str(tmp_path / "model.safetensors"))
    state.update(logit_scale=torch.tensor([[2.5]]), bias=torch.tensor([[0.5, -0.5]]))
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    scale, bias = class_head(gedi)
    assert scale == 2.5 and bias.tolist() == [0.5, -0.5]


def test_gedi_class_codes_must_be_single_tokens_and_known_by_task(lm: LoadedLM) -> None:
    with pytest.raises(MethodError, match="class code 'good man' is 2 tokens"):
        build(lm, "gedi", {**GEDI_TEST, "code_desired": "good man"})
    with pytest.raises(MethodError, match="no published class codes for task 'regard'"):
        build(lm, "gedi", {"gedi_model": "tiny-random/gpt2"}, task="regard")


# --- extra models ------------------------------------------------------------------------------


def test_an_expert_with_another_tokenizer_is_refused(lm: LoadedLM, models: dict[str, str]) -> None:
    with pytest.raises(
        MethodError, match="different tokenizer.*only in dexperts expert: \\['zebra'\\]"
    ):
        load_extra_lm(lm, models["other"], "expert", "dexperts")
    with pytest.raises(MethodError, match="gedi gedi_model .* different tokenizer"):
        build(lm, "gedi", {**GEDI_TEST, "gedi_model": models["other"]})


def test_missing_experts_are_clear_errors(lm: LoadedLM, tmp_path: Path) -> None:
    with pytest.raises(MethodError, match="parameter `anti_expert` is required"):
        build(lm, "dexperts", {"expert": "tiny-random/gpt2"})
    with pytest.raises(MethodError, match="parameter `gedi_model` is required"):
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

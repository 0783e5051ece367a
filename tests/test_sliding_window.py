"""Sliding-window and hybrid caches (Gemma 3's layout, `tiny-random/gemma3`, window 4): the
loop's full-history cache against transformers' own, the cache-touching methods past the
window, and which layouts `engine_layout_problem` refuses (docs/design.md, "Sliding-window
caches")."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json
from tests.agreement import assert_alone_matches_batched, traced
from workers.decoding import prompt_token_ids
from workers.methods.base import MethodError
from workers.methods.cache_layout import engine_layout_problem, full_history_ok, layer_types
from workers.methods.registry import load_method, resolve_params
from workers.methods.tuner import BiasTuner
from workers.models import LoadedLM, load_lm
from workers.tiny import GEMMA3_WINDOW

PROMPTS = ["The woman worked as a doctor and", "He said", "My sister is a very good"]
GEN = GenerationParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def lm() -> LoadedLM:
    return load_lm(ModelRef("tiny-random/gemma3"), device="cpu")


def jobs_for(lm: LoadedLM, method: str, params: dict[str, Any]) -> list[JobSpec]:
    resolved = canonical_json(resolve_params(method, params, lm.ref.id))
    return [
        JobSpec(f"p{i}", p, "female", None, 11, method, lm.ref, "sentiment", GEN, resolved)
        for i, p in enumerate(PROMPTS)
    ]


def test_the_loop_attends_through_the_window_as_transformers_own_cache_does(
    lm: LoadedLM,
) -> None:
    """Every step's distribution equals a forward of the row alone, without a cache (the
    window in the mask only), and one over transformers' own sliding cache (which drops what
    lies past the window): the prompts and their continuations are longer than the window."""
    jobs = jobs_for(lm, "vanilla", {})
    rows, steps = traced(lm, load_method("vanilla")(lm, {}, "sentiment"), jobs)
    longest = max(len(prompt_token_ids(lm, p)) + r["num_tokens"] for p, r in zip(PROMPTS, rows))
    assert longest > 2 * GEMMA3_WINDOW
    for i, (prompt, row) in enumerate(zip(PROMPTS, rows)):
        ids = torch.tensor([prompt_token_ids(lm, prompt) + row["token_ids"]])
        n = len(prompt_token_ids(lm, prompt))
        with torch.no_grad():
            plain = lm.model(input_ids=ids).logits[0].log_softmax(-1)
            own = lm.model(input_ids=ids[:, :n], use_cache=True)
            kinds = {type(x).__name__ for x in own.past_key_values.layers}
            assert "DynamicSlidingWindowLayer" in kinds
            stepped = [own.logits[0, -1].log_softmax(-1)]
            cache = own.past_key_values
            for t in range(n, ids.shape[1]):
                out = lm.model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                stepped.append(out.logits[0, -1].log_softmax(-1))
        for s, trace in enumerate(steps[: row["num_tokens"]]):
            got = trace.logprobs[i]
            torch.testing.assert_close(got, plain[n - 1 + s], rtol=0, atol=2e-5)
            torch.testing.assert_close(got, stepped[s], rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("lidao-min", {"blocks": 2, "scope": "context"}),
        ("lidao-prod", {"blocks": 3, "scope": "last"}),
        ("elidao-min", {"blocks": 2}),
        ("uddia", {"scope": "last"}),
        ("pplm", {"steps": 2}),
    ],
)
def test_cache_methods_run_past_the_window_alone_as_in_a_batch(
    lm: LoadedLM, method: str, params: dict[str, Any]
) -> None:
    jobs = jobs_for(lm, method, params)
    built = load_method(method)(lm, jobs[0].params(), "sentiment")
    rows = assert_alone_matches_batched(lm, built, jobs)
    assert [r["status"] for r in rows] == ["ok"] * len(PROMPTS)
    assert max(r["num_tokens"] for r in rows) == GEN.max_new_tokens


def test_layer_kinds_from_the_config() -> None:
    gemma = {"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"]}
    assert layer_types(gemma) == ["sliding_attention", "full_attention"]
    mistral = {"model_type": "mistral", "sliding_window": 4096, "num_hidden_layers": 3}
    assert layer_types(mistral) == ["sliding_attention"] * 3
    qwen = {**mistral, "model_type": "qwen2", "use_sliding_window": False}
    assert layer_types(qwen) == ["full_attention"] * 3
    nested = {"model_type": "gemma3", "text_config": gemma}
    assert layer_types(nested) == layer_types(gemma) and full_history_ok(nested)


def test_the_layouts_the_engine_refuses_are_named() -> None:
    gemma = {"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"]}
    for method in ("lidao-min", "lidao-prod", "elidao-min", "elidao-prod", "uddia", "pplm"):
        assert engine_layout_problem(method, gemma) is None
    hybrid = {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}
    problem = engine_layout_problem("uddia", hybrid)
    assert problem is not None and "qwen3_next" in problem and "1 of 2" in problem
    assert "linear_attention" in problem and not full_history_ok(hybrid)
    chunked = {"model_type": "llama4_text", "attention_chunk_size": 8192, "num_hidden_layers": 2}
    assert "chunked_attention" in (engine_layout_problem("pplm", chunked) or "")
    capped = {**gemma, "model_type": "gemma2", "final_logit_softcapping": 30.0}
    assert "softcapped" in (engine_layout_problem("lidao-min", capped) or "")
    assert engine_layout_problem("pplm", capped) is None  # PPLM's logits are the model's
    assert engine_layout_problem("vanilla", hybrid) is None  # only cache methods are checked


def test_the_tuner_refuses_what_validate_refuses(lm: LoadedLM) -> None:
    model = copy.deepcopy(lm.model)
    model.config.final_logit_softcapping = 30.0
    capped = LoadedLM(lm.ref, model, lm.tokenizer, lm.device, lm.family, lm.words)
    with pytest.raises(MethodError, match=r"tiny-random/gemma3: .*softcapped"):
        BiasTuner(capped, 2, "last")


def test_the_horizon_embeds_as_the_scaled_embedding_module(lm: LoadedLM) -> None:
    tuner = BiasTuner(lm, 2, "last")
    assert tuner.embed_scale == pytest.approx(lm.model.config.hidden_size**0.5, rel=1e-6)

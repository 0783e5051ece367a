"""Builders shared by the baselines' tests (PPLM, GeDi, DExperts on tiny models): jobs, methods,
runs through the shared loop, step recordings, cache-free logits, saved tiny model variants."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from jobs.spec import GenerationParams, JobSpec
from tests.helpers import step0_context
from workers.decoding import decode_batch
from workers.methods.base import DecodingMethod, StepContext
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM
from workers.tiny import build_tiny_lm

PROMPTS = ["the doctor said that she", "he is a", "my mother was very"]
GEN = GenerationParams(max_new_tokens=6, temperature=0.8, repetition_penalty=1.2)
GEN_PLAIN = GenerationParams(max_new_tokens=5, temperature=0.8)  # process = log_softmax(z / 0.8)
GEDI_TEST = {"gedi_model": "tiny-random/gpt2", "code_desired": "good", "code_undesired": "bad"}


def save_tiny_variants(root: Path) -> dict[str, str]:
    """Saved tiny GPT-2 variants: an expert that favours 'happy', one with another tokenizer."""
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

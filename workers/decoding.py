"""The shared batched decoding loop: one place for padding, cache, sampling and stopping.

Each job's randomness comes from its own `torch.Generator` seeded with `JobSpec.rng_seed`:
one uniform per step per row, turned into a token by inverse-CDF sampling over the nucleus.
So a job samples the same tokens alone or in any batch, and a method whose distribution equals
vanilla's samples vanilla's tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from jobs.spec import JobSpec
from results.schema import generation_row
from workers.methods.base import DecodingMethod, StepContext
from workers.models import LoadedLM


def check_batch(jobs: Sequence[JobSpec]) -> None:
    """A batch shares model, method, parameters, task and generation parameters."""
    keys = {(j.model, j.method, j.method_params, j.task, j.generation) for j in jobs}
    if len(keys) != 1:
        raise ValueError(
            f"a batch must share model/method/params/task/generation; got {len(keys)} kinds"
        )


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL penalty: divide positive / multiply negative logits of tokens already in the text."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


NUCLEUS_CANDIDATES = 256  # top-k tried first; rows whose nucleus is wider fall back to a full sort


def nucleus_sample(logprobs: torch.Tensor, top_p: float, uniforms: torch.Tensor) -> torch.Tensor:
    """(B,) tokens from (B, V) log-probs: smallest set with mass ≥ top_p, inverse CDF at `uniforms`.

    Computed in float64. The candidates come from `topk` (ordered, ~8× cheaper than sorting 50k
    entries); when they do not reach `top_p` for some row, the batch uses a full stable sort.
    Either way each row's result depends only on its own distribution.
    """
    probs = torch.softmax(logprobs.double(), dim=-1)
    k = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    sorted_p, order = torch.topk(probs, k, dim=-1)
    cum = torch.cumsum(sorted_p, dim=-1)
    if k < probs.shape[-1] and not bool((cum[:, -1] >= top_p).all()):
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        cum = torch.cumsum(sorted_p, dim=-1)
    keep = (cum - sorted_p) < top_p  # always keeps the most likely token
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    cdf = torch.cumsum(kept, dim=-1)
    target = uniforms.double().unsqueeze(-1) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).clamp_max(sorted_p.shape[-1] - 1)
    idx = torch.minimum(idx, keep.sum(-1, keepdim=True) - 1)  # never past the nucleus
    return order.gather(-1, idx).squeeze(-1)


def prompt_token_ids(lm: LoadedLM, prompt: str) -> list[int]:
    """The prompt's ids with the tokenizer's BOS in front (added here when the tokenizer does not,
    e.g. GPT-2): generation conditions on BOS + prompt, as the UDDIA reference and head training do."""
    ids = list(lm.tokenizer(prompt)["input_ids"])
    bos = lm.tokenizer.bos_token_id
    if bos is not None and ids and ids[0] != bos:
        ids = [int(bos), *ids]
    return ids


def _prefill_inputs(lm: LoadedLM, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded (B, T) ids and attention mask of the prompts."""
    width = max(len(p) for p in prompt_ids)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(prompt_ids), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if p:
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
    return ids.to(lm.device), mask.to(lm.device)


def max_context(lm: LoadedLM) -> int | None:
    cfg = lm.model.config
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            return value
    return None


def decode_batch(
    lm: LoadedLM, method: DecodingMethod, jobs: Sequence[JobSpec]
) -> list[dict[str, Any]]:
    """Generate one continuation per job; returns GENERATION_SCHEMA rows in job order."""
    check_batch(jobs)
    start = time.perf_counter()
    gen = jobs[0].generation
    prompt_ids = [prompt_token_ids(lm, j.prompt) for j in jobs]
    limit = max_context(lm)
    failures: dict[int, str] = {}
    for i, p in enumerate(prompt_ids):
        if not p:
            failures[i] = f"job {jobs[i].job_id}: prompt tokenises to no tokens"
        elif limit is not None and len(p) + gen.max_new_tokens > limit:
            failures[i] = (
                f"job {jobs[i].job_id}: prompt of {len(p)} tokens + max_new_tokens "
                f"{gen.max_new_tokens} exceeds the model's context of {limit}"
            )
    # A failed row still takes part in the batch's tensors: give it a one-token stand-in prompt.
    filler = [lm.eos_id if lm.eos_id is not None else 0]
    safe_ids = [filler if i in failures else p for i, p in enumerate(prompt_ids)]
    input_ids, mask = _prefill_inputs(lm, safe_ids)
    grads = method.needs.gradients
    outer = nullcontext() if grads else torch.inference_mode()
    with outer:
        generated, finish = _loop(lm, method, jobs, safe_ids, input_ids, mask, failures)
    elapsed = time.perf_counter() - start
    return [
        _row(lm, method, jobs[i], i, generated[i], finish[i], failures.get(i), elapsed / len(jobs))
        for i in range(len(jobs))
    ]


def _loop(
    lm: LoadedLM,
    method: DecodingMethod,
    jobs: Sequence[JobSpec],
    prompt_ids: list[list[int]],
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    failures: dict[int, str],
) -> tuple[list[list[int]], list[str]]:
    gen = jobs[0].generation
    B, dev = len(jobs), lm.device
    eos = lm.eos_id
    pad = int(lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0)
    rngs = [torch.Generator().manual_seed(j.rng_seed) for j in jobs]
    want_hidden = method.needs.hidden_states
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    seen = torch.zeros((B, vocab), dtype=torch.bool, device=dev)
    seen.scatter_(1, input_ids, mask.bool())
    active = torch.tensor([i not in failures for i in range(B)], device=dev)
    generated: list[list[int]] = [[] for _ in range(B)]
    finish = ["error" if i in failures else "length" for i in range(B)]

    def process(logits: torch.Tensor) -> torch.Tensor:
        z = repetition_penalty(logits.float(), seen, gen.repetition_penalty)
        return torch.log_softmax(z / gen.temperature, dim=-1)

    method.begin(jobs, prompt_ids)
    with torch.no_grad():
        out = lm.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            output_hidden_states=want_hidden,
            logits_to_keep=1,
        )
    for step in range(gen.max_new_tokens):
        if not bool(active.any()):
            break
        ctx = StepContext(
            model=lm.model,
            step=step,
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=out.past_key_values,
            logits=out.logits[:, -1, :].float(),
            hidden_states=out.hidden_states if want_hidden else None,
            active=active,
            jobs=jobs,
            process=process,
            failures=failures,
        )
        logprobs = method.next_logprobs(ctx).detach()
        bad = torch.isnan(logprobs).any(-1) | ~torch.isfinite(logprobs).any(-1)
        for i in torch.nonzero(bad & active).flatten().tolist():
            ctx.fail(i, f"non-finite next-token distribution at step {step}")
        for i in list(failures):
            if bool(active[i]):
                active[i] = False
                finish[i] = "error"
        uniforms = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in rngs])
        safe = torch.where(active.unsqueeze(-1), logprobs, torch.zeros_like(logprobs))
        tokens = nucleus_sample(safe, gen.top_p, uniforms.to(dev))
        tokens = torch.where(active, tokens, torch.full_like(tokens, pad))
        for i, tok in enumerate(tokens.tolist()):
            if not bool(active[i]):
                continue
            if eos is not None and tok == eos:
                active[i] = False
                finish[i] = "eos"
            else:
                generated[i].append(tok)
        seen.scatter_(1, tokens.unsqueeze(-1), active.unsqueeze(-1))
        method.after_token(ctx, tokens)
        if step + 1 == gen.max_new_tokens or not bool(active.any()):
            break
        input_ids = torch.cat([input_ids, tokens.unsqueeze(-1)], dim=-1)
        mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], dim=-1)
        position_ids = torch.cat([position_ids, position_ids[:, -1:] + 1], dim=-1)
        with torch.no_grad():
            out = lm.model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=mask,
                position_ids=position_ids[:, -1:],
                past_key_values=out.past_key_values,
                use_cache=True,
                output_hidden_states=want_hidden,
                logits_to_keep=1,
            )
    return generated, finish


def _row(
    lm: LoadedLM,
    method: DecodingMethod,
    job: JobSpec,
    i: int,
    ids: list[int],
    finish: str,
    error: str | None,
    elapsed: float,
) -> dict[str, Any]:
    tok = lm.tokenizer
    ids = [] if error else ids
    row = generation_row(
        job.to_row(),
        continuation=tok.decode(ids, skip_special_tokens=True) if ids else "",
        num_tokens=len(ids),
        token_ids=ids,
        tokens=[tok.decode([t]) for t in ids],
        finish_reason=finish,
        status="error" if error else "ok",
        error=error,
        effective_params=json.dumps(method.effective_params(), sort_keys=True, default=str),
        elapsed_s=elapsed,
        model_commit=getattr(lm.model.config, "_commit_hash", None),
    )
    row.update(method.row_columns(i))
    return row

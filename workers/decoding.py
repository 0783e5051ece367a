"""The shared batched decoding loop: one place for padding, cache, sampling and stopping.

Each step's token comes from `workers.sampler`: a nucleus cut that rounding cannot move and a
race on noise hashed from (`JobSpec.rng_seed`, step, token id) on the device. So a job draws the
same noise alone or in any batch, and a method whose distribution equals vanilla's samples
vanilla's tokens (see docs/design.md for what is exact and what holds within rounding).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any, NamedTuple

import torch
from transformers.cache_utils import DynamicCache

from jobs.queue import batch_key
from jobs.spec import JobSpec
from results.schema import generation_row
from workers.methods.base import DecodingMethod, StepContext
from workers.methods.cache_layout import full_history_ok
from workers.models import LoadedLM
from workers.sampler import sample_full, sample_topk


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL penalty: divide positive / multiply negative logits of tokens already in the text."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def seen_mask(ids: torch.Tensor, real: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, V + 1) bool: True at every id that occurs at a `real` position of (B, T) `ids`.

    Positions that are not real (left padding, the leading BOS) are sent to the spare column V
    instead of being scattered with the value False: with pad = BOS (GPT-2) a False and a True
    would race for the same cell (nondeterministic on CUDA). Every write stores True, so the
    result does not depend on the order of the writes. Read it as `mask[:, :V]`.
    """
    mask = torch.zeros((ids.shape[0], vocab + 1), dtype=torch.bool, device=ids.device)
    mask.scatter_(1, torch.where(real, ids, vocab), True)
    return mask


def prompt_token_ids(lm: LoadedLM, prompt: str) -> list[int]:
    """The prompt's ids with the tokenizer's BOS in front (added here when the tokenizer does not,
    e.g. GPT-2): generation conditions on BOS + prompt, as the UDDIA reference and head training do."""
    ids = list(lm.tokenizer(prompt)["input_ids"])
    bos = lm.tokenizer.bos_token_id
    if bos is not None and ids and ids[0] != bos:
        ids = [int(bos), *ids]
    return ids


def continuation_text(tokenizer: Any, prompt_ids: Sequence[int], ids: Sequence[int]) -> str:
    """The text `ids` add after the prompt: prompt + continuation decoded together, minus the
    decoded prompt (docs/design.md, "The decoding loop": a lone decode drops SentencePiece's
    boundary space). Should the decoded prompt not be a prefix of the whole (a decoder that
    rewrites across the boundary), the text after their common prefix is taken.
    """
    if not ids:
        return ""
    head = tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
    whole = tokenizer.decode([*prompt_ids, *ids], skip_special_tokens=True)
    if whole.startswith(head):
        return str(whole[len(head) :])
    return str(whole[len(os.path.commonprefix([head, whole])) :])


def left_padded(lm: LoadedLM, prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The left-padded (B, T) ids and attention mask of the prompts (an empty row: all pad)."""
    width = max(len(p) for p in prompt_ids)
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(prompt_ids), width), int(pad), dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        if p:
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
    return ids.to(lm.device), mask.to(lm.device)


def loop_cache(lm: LoadedLM) -> Any:
    """The cache the loop starts a batch with: full-attention layers that keep every position
    (`DynamicCache()`) where they serve every layer of the model, sliding-window ones included
    (their window is in the model's mask); else None, the model's own (docs/design.md,
    "Sliding-window caches")."""
    return DynamicCache() if full_history_ok(lm.model.config.to_dict()) else None


def max_context(lm: LoadedLM) -> int | None:
    cfg = lm.model.config
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            return value
    return None


class StepTrace(NamedTuple):
    """What one step sampled from, for tests and debugging (`decode_batch(on_step=...)`)."""

    step: int
    logprobs: torch.Tensor  # (B, V) the method's distribution (before top-p)
    seeds: torch.Tensor  # (B,) int64: the jobs' rng seeds, which key the step's noise
    tokens: torch.Tensor  # (B,) sampled (pad for rows that were not generating)
    active: torch.Tensor  # (B,) bool: rows that sampled a token at this step


def decode_batch(
    lm: LoadedLM,
    method: DecodingMethod,
    jobs: Sequence[JobSpec],
    on_step: Callable[[StepTrace], None] | None = None,
) -> list[dict[str, Any]]:
    """Generate one continuation per job; returns GENERATION_SCHEMA rows in job order.

    `on_step`, when given, is called after every step with copies of what it sampled from.
    """
    if (kinds := len({batch_key(j) for j in jobs})) != 1:
        raise ValueError(
            f"a batch must share model/method/params/task/generation; got {kinds} kinds"
        )
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
    input_ids, mask = left_padded(lm, safe_ids)
    outer = nullcontext() if method.needs.gradients else torch.inference_mode()
    try:
        with outer:
            generated, finish = _loop(
                lm, method, jobs, safe_ids, input_ids, mask, failures, on_step
            )
        per_job = (time.perf_counter() - start) / len(jobs)
        return [
            _row(lm, method, job, i, prompt_ids[i], generated[i], finish[i], failures, per_job)
            for i, job in enumerate(jobs)
        ]
    finally:
        method.end()


def _loop(
    lm: LoadedLM,
    method: DecodingMethod,
    jobs: Sequence[JobSpec],
    prompt_ids: list[list[int]],
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    failures: dict[int, str],
    on_step: Callable[[StepTrace], None] | None = None,
) -> tuple[list[list[int]], list[str]]:
    """The steps of one batch. Device work is queued without host round trips except one
    transfer per step: the sampled tokens with the rows' flags (`_fetch`)."""
    gen = jobs[0].generation
    B, dev = len(jobs), lm.device
    eos = lm.eos_id
    pad = int(lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0)
    seeds = torch.tensor([j.rng_seed for j in jobs], dtype=torch.long, device=dev)
    want_hidden = method.needs.hidden_states
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    seen = seen_mask(input_ids, _real_prompt_positions(lm, input_ids, mask), vocab)
    live = [i not in failures for i in range(B)]  # host mirror of `active`
    active = torch.tensor(live, device=dev)
    dead = torch.full((vocab,), -torch.inf, dtype=torch.float64, device=dev)
    dead[pad] = 0.0  # a finished row samples pad on the top-k path (its token is discarded)
    generated: list[list[int]] = [[] for _ in range(B)]
    finish = ["error" if i in failures else "length" for i in range(B)]
    known_failures = len(failures)

    def process(logits: torch.Tensor) -> torch.Tensor:
        z = repetition_penalty(logits.float(), seen[:, :vocab], gen.repetition_penalty)
        return torch.log_softmax(z / gen.temperature, dim=-1)

    method.begin(jobs, prompt_ids)
    with method.theta_forward(B):  # no autograd, or through a tuned method's zero offsets
        out = lm.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=loop_cache(lm),
            use_cache=True,
            output_hidden_states=want_hidden,
            logits_to_keep=1,
        )
    for step in range(gen.max_new_tokens):
        ctx = StepContext(
            model=lm.model,
            step=step,
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=out.past_key_values,
            logits=out.logits[:, -1, :].detach().float(),
            hidden_states=tuple(h.detach() for h in out.hidden_states) if want_hidden else None,
            active=active,
            jobs=jobs,
            process=process,
            failures=failures,
        )
        logprobs = method.next_logprobs(ctx).detach()
        if len(failures) != known_failures:  # a method failed rows (rare): one small upload
            known_failures = len(failures)
            active &= torch.tensor([i not in failures for i in range(B)], device=dev)
        bad = torch.isnan(logprobs).any(-1) | ~torch.isfinite(logprobs).any(-1)
        ok = active & ~bad
        safe = torch.where(ok.unsqueeze(-1), logprobs.double(), dead)
        probs = torch.softmax(safe, dim=-1)
        tokens, exact = sample_topk(probs, gen.top_p, seeds, step)
        tokens = torch.where(ok, tokens, pad)
        host_tokens, redo, host_bad = _fetch(tokens, exact, bad)  # the step's one transfer
        if redo:
            rows = torch.tensor(redo, device=dev)
            tokens[rows] = sample_full(probs[rows], gen.top_p, seeds[rows], step)
            host_tokens = tokens.tolist()
        for i in range(B):
            if not live[i]:
                continue
            if i in failures or host_bad[i]:
                if i not in failures:
                    ctx.fail(i, f"non-finite next-token distribution at step {step}")
                live[i], finish[i] = False, "error"
            elif eos is not None and host_tokens[i] == eos:
                live[i], finish[i] = False, "eos"
            else:
                generated[i].append(host_tokens[i])
        if on_step is not None:
            on_step(StepTrace(step, logprobs.clone(), seeds, tokens.clone(), ok.clone()))
        if eos is not None:
            ok &= tokens != eos
        active &= ok  # in place: methods hold this tensor through ctx.active
        seen.scatter_(1, torch.where(ok, tokens, vocab).unsqueeze(-1), True)
        method.after_token(ctx, tokens)
        if step + 1 == gen.max_new_tokens or not any(live):
            break
        input_ids = torch.cat([input_ids, tokens.unsqueeze(-1)], dim=-1)
        mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], dim=-1)
        position_ids = torch.cat([position_ids, position_ids[:, -1:] + 1], dim=-1)
        with method.theta_forward(B):
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


def _real_prompt_positions(lm: LoadedLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the prompt's own tokens, without left padding and the leading BOS. Only these
    (and generated tokens) count for the repetition penalty: BOS is not text, and for GPT-2 it
    is also EOS, which the penalty would otherwise make less likely."""
    real = mask.bool()
    bos = lm.tokenizer.bos_token_id
    if bos is not None:
        first = torch.arange(mask.shape[1], device=mask.device) == (mask == 0).sum(-1, True)
        real &= ~(first & (ids == bos))
    return real


def _fetch(
    tokens: torch.Tensor, exact: torch.Tensor, bad: torch.Tensor
) -> tuple[list[int], list[int], list[bool]]:
    """The host's copy of one step in one sync: tokens, rows to redo with a full sort (not
    `exact`, not `bad`), non-finite rows."""
    packed = torch.stack([tokens, exact.long(), bad.long()]).tolist()
    redo = [i for i, (e, b) in enumerate(zip(packed[1], packed[2])) if not e and not b]
    return packed[0], redo, [bool(b) for b in packed[2]]


def _row(
    lm: LoadedLM,
    method: DecodingMethod,
    job: JobSpec,
    i: int,
    prompt_ids: list[int],
    ids: list[int],
    finish: str,
    failures: dict[int, str],
    elapsed: float,
) -> dict[str, Any]:
    tok = lm.tokenizer
    error = failures.get(i)
    ids = [] if error else ids
    row = generation_row(
        job.to_row(),
        continuation=continuation_text(tok, prompt_ids, ids),
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

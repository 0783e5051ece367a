"""Perplexity of a continuation given its prompt under a causal LM (fluency).

    ppl = exp( mean over continuation tokens t of -log p(x_t | prompt, x_<t) )

The continuation's ids are those the scorer's tokenizer gives it after the prompt
(`continuation_ids`; why not the continuation alone: docs/footguns.md). Labels are -100 on
prompt tokens and padding. Batches are right-padded: under a causal mask real tokens never see
the padding, so a batch scores exactly like its rows one by one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

from jobs.catalog import SCORER_PARAMS
from jobs.spec import ModelRef
from workers.scorers.base import Scorer, ScorerContext, ScorerError, null_row, score_nonempty

IGNORE = -100


class Perplexity(Scorer):
    """`perplexity`: exp(mean NLL of the continuation tokens | prompt) under `model`."""

    name = "perplexity"
    metric = "perplexity"
    num_cpus = 0.5  # fractional: several scorer actors share a small machine
    wants_gpu = True
    default_params: ClassVar[dict[str, Any]] = SCORER_PARAMS["perplexity"]

    def __init__(self, params: dict[str, Any], context: ScorerContext) -> None:
        super().__init__(params, context)
        from workers.models import load_lm

        ref = ModelRef(
            str(self.params["model"]), self.params["revision"], str(self.params["dtype"])
        )
        try:
            self.lm = load_lm(ref, device=context.device, words=context.words)
        except ValueError as exc:  # offline and not cached: at once (workers.hub), one line
            raise ScorerError(f"scorer {self.name!r}, parameter model: {exc}") from exc
        tok = self.lm.tokenizer
        # Context for a continuation of an empty prompt: the BOS (GPT-2: <|endoftext|>) token.
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.start_id: int | None = int(start) if start is not None else None
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)

    @property
    def version(self) -> str:
        config = self.lm.model.config
        rev = self.params["revision"] or getattr(config, "_commit_hash", None) or "local"
        return f"ppl-v2:{self.params['model']}@{rev}:{self.params['dtype']}"

    def token_ids(self, row: dict[str, Any]) -> tuple[list[int], list[int]]:
        """(prompt ids, continuation ids) with the scorer's tokenizer."""
        tok = self.lm.tokenizer
        text = str(row["prompt"])
        prompt = list(tok(text)["input_ids"])  # with BOS if the tokenizer adds one
        cont = continuation_ids(tok, text, str(row.get("continuation") or ""), prompt)
        if not prompt:
            if self.start_id is None:
                raise ScorerError(
                    "empty prompt and the tokenizer has no BOS/EOS token to start from"
                )
            prompt = [self.start_id]
        return prompt, cont

    def score(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return score_nonempty(self, rows, int(self.params["batch_size"]), self._score_batch)

    def _score_batch(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        nll = self.mean_nll([self.token_ids(r) for r in rows])
        return [  # None: the continuation has no token under this tokenizer
            null_row(self, row, "empty")
            if value is None
            else {**self.key(row), "perplexity": math.exp(value)}
            for row, value in zip(rows, nll)
        ]

    def mean_nll(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[float | None]:
        """Mean NLL (nats) of each continuation given its prompt; None for no tokens."""
        import torch

        from workers.decoding import max_context

        width = max(len(p) + len(c) for p, c in pairs)
        limit = max_context(self.lm)
        if limit is not None and width > limit:
            raise ScorerError(f"prompt + continuation is {width} tokens; the model takes {limit}")
        ids = torch.full((len(pairs), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(pairs), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(pairs), width), dtype=torch.long)
        for b, (prompt, cont) in enumerate(pairs):
            seq = prompt + cont
            ids[b, : len(seq)] = torch.tensor(seq)
            mask[b, : len(seq)] = 1
            labels[b, len(prompt) : len(seq)] = torch.tensor(cont, dtype=torch.long)
        dev = self.lm.device
        with torch.inference_mode():
            logits = self.lm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits
        # Position t predicts token t+1: (B, T-1, V) against (B, T-1).
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        target = labels[:, 1:].to(dev)
        picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T-1)
        keep = target != IGNORE
        total = -(picked * keep).sum(-1)
        count = keep.sum(-1)
        return [
            float(t) / int(n) if int(n) > 0 else None
            for t, n in zip(total.cpu().tolist(), count.cpu().tolist())
        ]


def continuation_ids(tok: Any, prompt: str, continuation: str, prompt_ids: list[int]) -> list[int]:
    """The ids `continuation` takes after `prompt` (whose ids are `prompt_ids`): the whole text's
    ids after the prompt's when they start with them, else the continuation tokenized alone."""
    if not continuation:
        return []
    if prompt_ids:
        whole = list(tok(prompt + continuation)["input_ids"])
        if len(whole) > len(prompt_ids) and whole[: len(prompt_ids)] == prompt_ids:
            return whole[len(prompt_ids) :]
    return list(tok(continuation, add_special_tokens=False)["input_ids"])

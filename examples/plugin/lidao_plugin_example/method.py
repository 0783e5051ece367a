"""`boost-word`: adds `strength` to the logit of one word's token before sampling."""

from __future__ import annotations

from typing import Any

import torch

from workers.methods.base import DecodingMethod, MethodError, StepContext


class BoostWord(DecodingMethod):
    name = "boost-word"

    def __init__(self, lm: Any, params: dict[str, Any], task: str) -> None:
        p = {"word": "the", "strength": 2.0, **params}
        ids = lm.tokenizer.encode(" " + p["word"], add_special_tokens=False) or []
        if len(ids) != 1:
            ids = lm.tokenizer.encode(p["word"], add_special_tokens=False) or []
        if len(ids) != 1:
            raise MethodError(f"boost-word: {p['word']!r} is not one token of {lm.ref.id}")
        super().__init__(lm, p, task)
        self.token = int(ids[0])

    def next_logprobs(self, ctx: StepContext) -> torch.Tensor:
        logits = ctx.logits.clone()
        logits[:, self.token] += float(self.params["strength"])
        return ctx.process(logits)

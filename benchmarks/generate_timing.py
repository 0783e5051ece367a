"""`bench_methods.py`'s baseline beside vanilla: transformers' `generate` on the same model and
prompts, timed like a method (`--no-generate` skips it)."""

from __future__ import annotations

import time

import torch

from benchmarks.method_timing import PROMPTS
from workers.decoding import prompt_token_ids
from workers.models import LoadedLM


class GenerateTimed:
    """transformers' `generate` on the vanilla row's model and prompts (BOS + prompt, left
    padded), nucleus sampling at the loop's top_p with no top-k, timed like `Timed`: the
    baseline the loop's CPU cost per token is compared with."""

    name = "hf-generate"

    def __init__(self, lm: LoadedLM, batch: int, tokens: int, top_p: float) -> None:
        self.lm, self.batch, self.tokens, self.top_p = lm, batch, tokens, top_p
        ids = [prompt_token_ids(lm, PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
        width = max(len(x) for x in ids)
        pad = int(lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0)
        self.input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        self.mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        self.input_ids, self.mask = self.input_ids.to(lm.device), self.mask.to(lm.device)
        self.best, self.made, self.cpu = float("inf"), 0, float("inf")
        self._generate(2)  # warm-up

    def _generate(self, tokens: int) -> torch.Tensor:
        with torch.inference_mode():
            return self.lm.model.generate(  # type: ignore[no-any-return]
                input_ids=self.input_ids,
                attention_mask=self.mask,
                do_sample=True,
                top_p=self.top_p,
                top_k=0,
                temperature=1.0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,  # as many tokens as the loop (random weights: EOS rare)
                pad_token_id=self.lm.tokenizer.pad_token_id or 0,
            )

    def once(self) -> None:
        start, cpu_start = time.perf_counter(), time.process_time()
        out = self._generate(self.tokens)
        if self.lm.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        n = (out.shape[1] - self.input_ids.shape[1]) * self.batch
        if elapsed < self.best:
            self.best, self.made = elapsed, n
        self.cpu = min(self.cpu, cpu_s / max(n, 1))

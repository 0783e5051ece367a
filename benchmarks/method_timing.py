"""`bench_methods.py`'s timing of one decoding method at one batch size: the random-weight LM,
the prompts, peak memory, the FLOP counter and the interleaved runs (`Timed`)."""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json
from jobs.words import builtin_gender_words
from workers.decoding import decode_batch
from workers.methods.registry import load_method, resolve_params
from workers.models import LoadedLM

SHAPES = {"gpt2-small": (12, 768, 12), "gpt2-large": (36, 1280, 20)}
PROMPTS = [
    "The woman walked into the room and",
    "My father always told me that",
    "She was known in the city as a",
    "The boy from the school said",
    "His sister works as a doctor and",
    "The queen spoke to the people about",
    "Her daughter wanted to become a",
    "The actor was asked why he",
]
TUNED = ["uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod"]


def build_lm(shape: str, device: str, tokenizer: str) -> LoadedLM:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(tokenizer)
    tok.padding_side, tok.pad_token = "left", tok.eos_token
    layers, dim, heads = SHAPES[shape]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, vocab_size=len(tok))
    )
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return LoadedLM(
        ModelRef(f"bench/{shape}-random"),
        model,
        tok,
        torch.device(device),
        "gpt2",
        builtin_gender_words(),
    )


class PeakMemory:
    """Peak memory growth during a block: the CUDA allocator's peak above what was allocated at
    the start (the model and what other runs keep are not counted), or sampled RSS growth on
    CPU."""

    def __init__(self, device: str) -> None:
        self.device, self.peak = device, 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base, self.stop = self._rss(), threading.Event()

        def sample() -> None:
            while not self.stop.wait(0.005):
                self.peak = max(self.peak, self._rss() - self.base)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.stop.set()
            self.thread.join()


def flop_counter() -> Any:
    """torch's `FlopCounterMode` that also counts the in-place products.

    Its registry has `addmm` and `baddbmm` but not `addmm_` / `baddbmm_` (it counts nothing for
    `x.addmm_(a, b)`), and the tuner's passes over the vocabulary accumulate with `addmm_`: without
    these entries the tuned methods' FLOPs came out ~0.15 GFLOP per token (~0.5× vanilla) low.
    """
    from torch.utils.flop_counter import FlopCounterMode

    def products(_acc: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> int:
        # (n, k) @ (k, m) or (batch, n, k) @ (batch, k, m), from the shapes the mode passes
        return 2 * math.prod(a) * b[-1]

    aten = torch.ops.aten
    return FlopCounterMode(
        display=False, custom_mapping={aten.addmm_: products, aten.baddbmm_: products}
    )


class Timed:
    """One method at one batch size: built and warmed up once, then timed run by run.

    `bench_methods.main` interleaves the runs of all methods of a batch size (vanilla, m1, m2,
    …, vanilla, m1, …) so that a change in the machine's load hits every method alike; each
    keeps the best of its runs. CPU time is the process's (all threads): on a shared machine it moves
    less than wall time when other processes take the cores.
    """

    def __init__(
        self, lm: LoadedLM, method: str, params: dict[str, object], batch: int, tokens: int
    ) -> None:
        gen = GenerationParams(max_new_tokens=tokens)
        resolved = canonical_json(resolve_params(method, params, lm.ref.id))
        self.lm, self.name, self.batch = lm, method, batch
        self.jobs = [
            JobSpec(
                f"p{i}",
                PROMPTS[i % len(PROMPTS)],
                "female",
                None,
                i // len(PROMPTS),
                method,
                lm.ref,
                "sentiment",
                gen,
                resolved,
            )
            for i in range(batch)
        ]
        self.built = load_method(method)(lm, self.jobs[0].params(), "sentiment")
        decode_batch(lm, self.built, self.jobs[: min(batch, 2)])  # warm-up (lazy init, kernels)
        self.best, self.made, self.cpu, self.peak = float("inf"), 0, float("inf"), 0
        self.flops = 0.0  # per generated token, from `count_flops`

    def once(self) -> None:
        """One timed run of the whole batch."""
        with PeakMemory(self.lm.device.type) as mem:
            start, cpu_start = time.perf_counter(), time.process_time()
            rows = decode_batch(self.lm, self.built, self.jobs)
            if self.lm.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        bad = [r["error"] for r in rows if r["status"] != "ok"]
        if bad:
            raise SystemExit(f"{self.name}: {bad[0]}")
        n = sum(r["num_tokens"] for r in rows)
        if elapsed < self.best:
            self.best, self.made = elapsed, n
        self.cpu = min(self.cpu, cpu_s / max(n, 1))
        self.peak = max(self.peak, mem.peak)

    def count_flops(self) -> None:
        """Floating-point operations per generated token of one run (`flop_counter`: matrix
        products and attention; independent of the machine and its load)."""
        with flop_counter() as counter:
            rows = decode_batch(self.lm, self.built, self.jobs)
        self.flops = counter.get_total_flops() / max(sum(r["num_tokens"] for r in rows), 1)

    def result(self) -> tuple[float, float, int, float]:
        """(tokens/s, ms per step, peak bytes, CPU s per token) of the best run."""
        steps = max(1, self.made // self.batch)
        return self.made / self.best, self.best / steps * 1000, self.peak, self.cpu


def time_method(
    lm: LoadedLM, method: str, params: dict[str, object], batch: int, tokens: int, repeats: int
) -> tuple[float, float, int, float]:
    """(tokens/s, ms per step, peak bytes, CPU s per token) of the best of `repeats` runs."""
    timed = Timed(lm, method, params, batch, tokens)
    for _ in range(repeats):
        timed.once()
    return timed.result()

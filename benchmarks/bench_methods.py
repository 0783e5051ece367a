"""Tokens/s of every decoding method against `vanilla`, in one process, on a random-weight LM.

    python benchmarks/bench_methods.py                       # GPT-2 small shape, batch 1 8 32
    python benchmarks/bench_methods.py --shape gpt2-large    # on a GPU
    python benchmarks/bench_methods.py --methods vanilla lidao-min --batch-sizes 8 --tokens 10

Prints, per method and batch size: tokens/s, ms per decoding step, the ratio of its cost per
token to vanilla's at the same batch size, and the peak memory of the run (CUDA: allocator peak;
CPU: peak resident set growth, sampled). The tokenizer is GPT-2's, read from `--tokenizer`
(a folder with vocab.json + merges.txt, or a hub id on a machine with internet).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.spec import GenerationParams, JobSpec, ModelRef, canonical_json  # noqa: E402
from jobs.words import builtin_gender_words  # noqa: E402
from workers.decoding import decode_batch  # noqa: E402
from workers.methods.heads import random_head, save_head  # noqa: E402
from workers.methods.registry import load_method, resolve_params  # noqa: E402
from workers.models import LoadedLM  # noqa: E402

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
    """Peak memory during a block: CUDA allocator peak, or sampled RSS growth on CPU."""

    def __init__(self, device: str) -> None:
        self.device, self.peak = device, 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
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
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self.stop.set()
            self.thread.join()


def time_method(
    lm: LoadedLM, method: str, params: dict[str, object], batch: int, tokens: int, repeats: int
) -> tuple[float, float, int]:
    """(tokens/s, ms per step, peak bytes) of the best of `repeats` runs after one warm-up."""
    gen = GenerationParams(max_new_tokens=tokens)
    resolved = canonical_json(resolve_params(method, params, lm.ref.id))
    jobs = [
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
    built = load_method(method)(lm, jobs[0].params(), "sentiment")
    decode_batch(lm, built, jobs[: min(batch, 2)])  # warm-up (lazy init, kernels)
    best, peak, made = float("inf"), 0, 0
    for _ in range(repeats):
        with PeakMemory(lm.device.type) as mem:
            start = time.perf_counter()
            rows = decode_batch(lm, built, jobs)
            if lm.device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
        bad = [r["error"] for r in rows if r["status"] != "ok"]
        if bad:
            raise SystemExit(f"{method}: {bad[0]}")
        if elapsed < best:
            best, made = elapsed, sum(r["num_tokens"] for r in rows)
        peak = max(peak, mem.peak)
    steps = max(max(1, made // batch), 1)
    return made / best, best / steps * 1000, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--tokenizer",
        default=str(Path(__file__).resolve().parents[2] / "shared/data/gpt2-tokenizer"),
    )
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--methods", nargs="+", default=["vanilla", *TUNED])
    ap.add_argument("--scope", choices=["context", "last"], default="context")
    ap.add_argument(
        "--blocks", type=int, default=None, help="tuned blocks (default: the method's, 18)"
    )
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    lm = build_lm(args.shape, args.device, args.tokenizer)
    head_dir = tempfile.mkdtemp(prefix="bench-head-")
    head, _ = save_head(random_head(lm, "sentiment"), os.path.join(head_dir, "head"))
    print(
        f"# shape={args.shape} device={args.device} tokens={args.tokens} scope={args.scope} "
        f"torch={torch.__version__} threads={torch.get_num_threads()}"
    )
    print(
        f"{'method':<12} {'batch':>5} {'tok/s':>9} {'ms/step':>9} {'x vanilla':>9} {'peak MiB':>9}"
    )
    for batch in args.batch_sizes:
        base = None
        for method in ["vanilla", *[m for m in args.methods if m != "vanilla"]]:
            params: dict[str, object] = {}
            if method in TUNED:
                params = {"scope": args.scope, "head": head}
                if args.blocks:
                    params["blocks"] = args.blocks
            tps, ms, peak = time_method(lm, method, params, batch, args.tokens, args.repeats)
            base = base or tps
            print(
                f"{method:<12} {batch:>5} {tps:>9.1f} {ms:>9.1f} {base / tps:>9.2f} {peak / 2**20:>9.0f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

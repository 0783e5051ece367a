"""Vanilla decoding-loop throughput: this tree's `workers/decoding.py` against an older revision's,
in one process, on the same random-weight model and jobs.

    PYTHONPATH=. python benchmarks/bench_loop.py --baseline 76f0c47 --batch-sizes 1 8 32

The baseline module is read with `git show REV:workers/decoding.py` and imported beside the
current one, so both loops run on the same model object; the ratio is what to read (2 shared
CPU cores are noisy; the runs alternate and each keeps its best). Prints tokens per second of
the process's CPU time (steadier than wall time on a shared machine) of each and current /
baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobs.spec import GenerationParams, JobSpec, ModelRef  # noqa: E402
from workers import decoding  # noqa: E402
from workers.methods.base import Vanilla  # noqa: E402
from workers.models import LoadedLM, load_lm  # noqa: E402


def baseline_module(rev: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:workers/decoding.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "decoding_baseline.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("decoding_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpt2_small_shape(layers: int) -> LoadedLM:
    """tiny-random/gpt2's tokenizer and loading path, GPT-2-small widths, random weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    cfg = GPT2Config(vocab_size=50257, n_layer=layers, n_embd=768, n_head=12, n_positions=1024)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    return dataclasses.replace(lm, model=model)


def jobs(n: int, tokens: int) -> list[JobSpec]:
    gen = GenerationParams(max_new_tokens=tokens, top_p=0.9, repetition_penalty=1.2)
    return [
        JobSpec(f"b:{i}", f"Sentence number {i} says that", "none", None, i, "vanilla",
                ModelRef("tiny-random/gpt2"), "sentiment", gen)
        for i in range(n)
    ]  # fmt: skip


def tokens_per_s(module: ModuleType, lm: LoadedLM, batch: list[JobSpec], repeats: int) -> float:
    method = Vanilla(lm, {}, "sentiment")
    best = 0.0
    for _ in range(repeats):
        start = time.process_time()
        rows = module.decode_batch(lm, method, batch)
        elapsed = time.process_time() - start
        best = max(best, sum(r["num_tokens"] for r in rows) / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="76f0c47", help="git revision of the old loop")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2, help="GPT-2-small blocks (12 = full)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old = baseline_module(args.baseline)
    lm = gpt2_small_shape(args.layers)
    print(f"vanilla, GPT-2-small widths, {args.layers} blocks, {args.tokens} tokens, best of "
          f"{args.repeats}; baseline = {args.baseline}")  # fmt: skip
    print(f"{'batch':>5} {'baseline tok/CPU s':>18} {'current tok/CPU s':>17} {'ratio':>6}")
    for b in args.batch_sizes:
        batch = jobs(b, args.tokens)
        tokens_per_s(decoding, lm, batch, 1)  # warm-up
        base = new = 0.0
        for _ in range(args.repeats):
            base = max(base, tokens_per_s(old, lm, batch, 1))
            new = max(new, tokens_per_s(decoding, lm, batch, 1))
        print(f"{b:>5} {base:>18.1f} {new:>17.1f} {new / base:>6.2f}")


if __name__ == "__main__":
    main()

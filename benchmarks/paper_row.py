"""`bench_methods.py --paper-row`: the paper's GPT-2 large row with lidao-min, end to end through
the generation actor's path (batches cut as the driver cuts them, written to Parquet)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.method_timing import PROMPTS
from harness.stages.generation.backends import Placement
from harness.stages.generation.stage import batch_jobs
from jobs.queue import make_batches
from jobs.spec import GenerationParams, JobSpec, canonical_json
from workers.decoding import decode_batch
from workers.generator import Generator
from workers.methods.registry import resolve_params
from workers.models import LoadedLM


def paper_prompts() -> list[str]:
    """The 175 female + 175 male prompts of the paper (../shared), else the built-in ones."""
    folder = Path(__file__).resolve().parents[2] / "shared/data/uddia-prompts"
    texts = []
    for group in ("female", "male"):
        path = folder / f"175prompts-{group}.jsonl"
        if path.exists():
            texts += [json.loads(line)["prompt"]["text"] for line in path.open() if line.strip()]
    return texts or PROMPTS


def paper_row(
    lm: LoadedLM, head: str, batch: int | str, limit: int | None, scope: str, out: str
) -> dict[str, Any]:
    """The paper's GPT-2 large row with lidao-min: 3,500 generations × 20 tokens, wall time.

    Runs the generation actor's own path: batches cut as the driver cuts them
    (`runtime.batch_size` = `batch`, `auto` by default), each decoded by a `Generator` (on a
    GPU: the measured probe and the memory sizer) and written to Parquet under `out`.
    """
    params = resolve_params("lidao-min", {"head": head, "scope": scope}, "gpt2-large")
    gen = GenerationParams(max_new_tokens=20, top_p=0.9, temperature=1.0)
    prompts = paper_prompts()
    jobs = [
        JobSpec(
            f"p{i}",
            text,
            "female",
            None,
            seed,
            "lidao-min",
            lm.ref,
            "sentiment",
            gen,
            canonical_json(params),
        )
        for seed in range(10)
        for i, text in enumerate(prompts)
    ][:limit]
    gpu = 1.0 if lm.device.type == "cuda" else 0.0
    size = batch_jobs(batch, Placement(1, gpu, 1.0, lm.device.type), len(jobs))
    print(f"# paper row: lidao-min {json.dumps(params, default=str)} batch_size={batch} ({size})")
    generator = Generator(lm.ref, out, lm=lm, name="paper-row")
    method = generator.method("lidao-min", jobs[0].method_params, "sentiment")
    decode_batch(lm, method, jobs[: min(2, len(jobs))])  # warm-up, not written, not measured
    start, made, ok = time.perf_counter(), 0, 0
    for chunk in make_batches(jobs, size):
        result = generator.run_batch(chunk)
        made, ok = made + result["tokens"], ok + result["ok"]
        if result["errors"]:
            raise SystemExit(f"paper row: {result['errors'][0]}")
    if lm.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    stats = dict(generator.stats, generations=len(jobs), ok=ok, tokens=made, wall_s=wall)
    peak = stats["peak_bytes_per_seq"]
    per_seq = f"{peak / 2**20:.1f}" if generator.sizer is not None else "n/a (measured on CUDA)"
    print(
        f"generations={len(jobs)} tokens={made} wall_s={wall:.1f} tok/s={made / wall:.1f} "
        f"(3,500 generations would take ~{wall * 3500 / len(jobs):.0f} s at this rate); "
        f"batches={stats['batches']} memory_probes={stats['memory_probes']} "
        f"memory_chunks={stats['memory_chunks']} oom_splits={stats['oom_splits']} "
        f"peak MiB/seq={per_seq}"
    )
    return stats

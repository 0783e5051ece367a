"""Tokens/s of every decoding method against `vanilla`, in one process, on a random-weight LM
of a built-in shape or on a real model (`--model`).

    python benchmarks/bench_methods.py                       # GPT-2 small shape, batch 1 8 32
    python benchmarks/bench_methods.py --shape gpt2-large    # on a GPU
    python benchmarks/bench_methods.py --methods vanilla lidao-min --batch-sizes 8 --tokens 10
    python benchmarks/bench_methods.py --paper-row --limit 16   # the paper's GPT-2 large row
    python benchmarks/bench_methods.py --model /work/models/smollm2-135m --batch-sizes 8 \
        --tokens 10 --no-reference   # a real model: a hub id, a local folder

Prints, per method and batch size: tokens/s, ms per decoding step, the ratio of its cost per
token to vanilla's at the same batch size (wall time, and process CPU time: steadier on a shared
machine), its speed-up in tokens/s over the `reference-style` row, and the peak memory of the
run (CUDA: allocator peak; CPU: peak resident set growth, sampled); then one PASS / FAIL line
per target of issue 12 that the run measured (with the target and the measured value), and the
load average. Beside vanilla, each batch size times transformers' `generate` on the same model
and prompts (nucleus sampling, no top-k) and prints the loop's CPU cost per token over its
(`--no-generate` skips it). `reference-style` rebuilds the UDDIA reference's call structure on the same model:
batch 1, a fresh `torch.optim.Adam` per token on the real bias parameters, the context re-run
at every step (see `reference_style`). `--paper-row` times the paper's GPT-2 large row end to
end: 3,500 generations (175 pairs × 2 × 10 seeds) × 20 tokens with lidao-min at the paper's
hyper-parameters (`--limit` runs the first N generations). The tokenizer is GPT-2's, read from
`--tokenizer` (a folder with vocab.json + merges.txt, or a hub id on a machine with internet).
`--model ID|PATH` loads that LM as a run would (`workers.models.load_lm`, its own tokenizer;
the tuned methods get a random head of its width); the reference-style row needs GPT-2's
layout and is skipped for any other family.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generate_timing import GenerateTimed  # noqa: E402
from benchmarks.issue12_targets import (  # noqa: E402
    TARGET_BATCH,
    TARGET_MARGIN,
    TARGET_RATIO,
    TARGET_SPEEDUP,
    Result,
    print_targets,
)
from benchmarks.method_phases import PHASES, phase_flops, phase_times  # noqa: E402
from benchmarks.method_timing import (  # noqa: E402
    PROMPTS,
    SHAPES,
    TUNED,
    PeakMemory,
    Timed,
    build_lm,
    flop_counter,
    time_method,
)
from benchmarks.paper_row import paper_prompts, paper_row  # noqa: E402
from benchmarks.reference_style import direct_demographic_scores, reference_style  # noqa: E402
from workers.methods.heads import random_head, save_head  # noqa: E402
from workers.models import LoadedLM  # noqa: E402

# what this script defined before its parts moved to the modules beside it
__all__ = [
    "GenerateTimed",
    "PHASES",
    "PROMPTS",
    "SHAPES",
    "TARGET_BATCH",
    "TARGET_MARGIN",
    "TARGET_RATIO",
    "TARGET_SPEEDUP",
    "TUNED",
    "PeakMemory",
    "Result",
    "Timed",
    "build_lm",
    "direct_demographic_scores",
    "flop_counter",
    "main",
    "paper_prompts",
    "paper_row",
    "phase_flops",
    "phase_times",
    "print_targets",
    "reference_style",
    "time_method",
]


def load_model(model: str, device: str) -> LoadedLM:
    """A real LM as an actor loads it, frozen."""
    from jobs.spec import ModelRef
    from workers.models import load_lm

    lm = load_lm(ModelRef(model), device=device)
    for p in lm.model.parameters():
        p.requires_grad_(False)
    return lm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    ap.add_argument("--model", help="a real LM (hub id or local folder) instead of a shape")
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
    ap.add_argument("--no-reference", action="store_true", help="skip the reference-style row")
    ap.add_argument(
        "--no-generate", action="store_true", help="skip transformers' `generate` beside vanilla"
    )
    ap.add_argument(
        "--paper-row", action="store_true", help="GPT-2 large shape, lidao-min, 3,500 × 20"
    )
    ap.add_argument("--limit", type=int, default=None, help="paper row: first N generations")
    ap.add_argument(
        "--paper-batch",
        type=lambda s: s if s == "auto" else int(s),
        default="auto",
        help="paper row: runtime.batch_size (a number, or auto: what the harness hands a replica)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument(
        "--flops", action="store_true", help="also count FLOPs per token (one extra run each)"
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="also print CPU ms per step and GFLOP per token in the loop's and the tuner's calls "
        "(two extra runs each)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.paper_row:
        args.shape = "gpt2-large"
    lm = (
        load_model(args.model, args.device)
        if args.model
        else build_lm(args.shape, args.device, args.tokenizer)
    )
    if lm.family != "gpt2":
        args.no_reference = True  # the reference-style row trains GPT-2's bias vectors
    head_dir = tempfile.mkdtemp(prefix="bench-head-")
    head, _ = save_head(random_head(lm, "sentiment"), os.path.join(head_dir, "head"))
    print(
        f"# {'model=' + args.model if args.model else 'shape=' + args.shape} device={args.device} tokens={args.tokens} scope={args.scope} "
        f"blocks={args.blocks} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    if args.paper_row:
        with tempfile.TemporaryDirectory(prefix="paper-row-") as out:
            paper_row(lm, head, args.paper_batch, args.limit, args.scope, out)
        return 0
    reference = None
    if not args.no_reference:
        blocks = args.blocks or 18
        reference, ref_ms = reference_style(lm, head, blocks, args.tokens, PROMPTS[:1])
        print(f"# reference-style (batch 1, Adam per token, context re-run): {reference:.2f} tok/s")
    print(
        f"{'method':<16} {'batch':>5} {'tok/s':>9} {'ms/step':>9} {'x vanilla':>9} "
        f"{'cpu x van':>9} {'x ref-style':>11} {'peak MiB':>9}"
        + (f" {'GFLOP/tok':>9} {'flop x van':>9}" if args.flops else "")
    )
    results: dict[tuple[str, int], Result] = {}
    for batch in args.batch_sizes:
        timed: list[Timed] = []
        for method in ["vanilla", *[m for m in args.methods if m != "vanilla"]]:
            params: dict[str, object] = {}
            if method in TUNED:
                params = {"scope": args.scope, "head": head}
                if args.blocks:
                    params["blocks"] = args.blocks
            timed.append(Timed(lm, method, params, batch, args.tokens))
        hf = None if args.no_generate else GenerateTimed(lm, batch, args.tokens, 0.9)
        for _ in range(args.repeats):  # interleaved: vanilla, m1, m2, …, vanilla, m1, …
            for t in timed:
                t.once()
            if hf is not None:
                hf.once()
        if args.flops:
            for t in timed:
                t.count_flops()
        base: Result | None = None
        for t in timed:
            tps, ms, peak, cpu = t.result()
            base = base or Result(tps, cpu, 1.0, 1.0, t.flops, 1.0)
            res = Result(
                tps,
                cpu,
                base.tps / tps,
                cpu / base.cpu,
                t.flops,
                t.flops / base.flops if base.flops else 0.0,
            )
            results[t.name, batch] = res
            speed = f"{tps / reference:>11.1f}" if reference else f"{'-':>11}"
            flops = f" {t.flops / 1e9:>9.2f} {res.flop_ratio:>9.2f}" if args.flops else ""
            print(
                f"{t.name:<16} {batch:>5} {tps:>9.1f} {ms:>9.1f} {res.ratio:>9.2f} "
                f"{res.cpu_ratio:>9.2f} {speed} {peak / 2**20:>9.0f}{flops}",
                flush=True,
            )
        if hf is not None:
            loop = timed[0]
            print(
                f"# batch {batch}: hf-generate {hf.made / hf.best:.1f} tok/s, CPU "
                f"{hf.cpu * 1e3:.2f} ms/token; vanilla loop CPU {loop.cpu * 1e3:.2f} ms/token; "
                f"loop CPU / generate CPU = {loop.cpu / hf.cpu:.3f}",
                flush=True,
            )
        if args.phases:
            for t in timed:
                spent = phase_times(t)
                parts = ", ".join(f"{k} {v:.0f}" for k, v in spent.items() if v > 0)
                print(f"# {t.name} batch {batch}, CPU ms per step: {parts}", flush=True)
                counted = phase_flops(t)
                parts = ", ".join(f"{k} {v:.3f}" for k, v in counted.items() if v > 0)
                print(f"# {t.name} batch {batch}, GFLOP per token: {parts}", flush=True)
        if reference and batch == args.batch_sizes[0]:
            base_ref = (base.tps if base else reference) / reference
            print(
                f"{'reference-style':<16} {1:>5} {reference:>9.1f} {ref_ms:>9.1f} "
                f"{base_ref:>9.2f} {'':>9} {1.0:>11.1f} {'':>9}",
                flush=True,
            )
    print_targets(results, reference, args)
    load = os.getloadavg()
    print(
        f"# load average at the end: {' '.join(f'{x:.2f}' for x in load)} on {os.cpu_count()} CPUs"
    )
    if load[0] > (os.cpu_count() or 1):
        print("# the machine was loaded: wall-time ratios track the other processes; read cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

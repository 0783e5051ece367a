"""Does a job's text depend on its batch, the thread count or MKL's kernels? Issue 31's sweep.

Every method on the five tiny layouts, 32 jobs (8 prompts × 4 seeds), 10 tokens at
temperature 0.75 and repetition penalty 1.2, each job alone, in batches of 8 and in one batch
of 32, at 1 thread, at 2 threads and at 1 thread with MKL_CBWR=COMPATIBLE. Each setting runs
in its own process (MKL reads that variable once), the three at the same time; each compares
its runs step by step with its own batch of 32 (`tests.agreement.compare_rows`), and the
parent compares every run's tokens, and each setting's batch of 32 step by step, with the
reference: the batch of 32 at 1 thread.

    PYTHONPATH=. python scripts/batch_sweep.py                  # the whole sweep
    PYTHONPATH=. python scripts/batch_sweep.py --layouts llama --methods pplm gedi
    PYTHONPATH=. python scripts/batch_sweep.py --keep DIR   # and, while or after it runs:
    PYTHONPATH=. python scripts/batch_sweep.py --summarise DIR

Prints one line per layout, method and setting: the runs compared, the rows whose text parts
from the reference (`parted`; of those, how many at a near-tie of the race: `ties`), steps
whose distributions differ only by GeDi's filter cut (`flips`, `tests.agreement.filter_flip`),
and the largest max |Δp| over the steps compared; then the totals per method. The settings are
the tests' (`tests/test_batch_independence.py`); PPLM runs at `--pplm-steps` (10, its default
for GPT-2 and OPT).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = ["gpt2", "opt", "opt-proj", "falcon", "llama"]
SETTINGS = {"1 thread": (1, {}), "2 threads": (2, {}), "MKL_CBWR": (1, {"MKL_CBWR": "COMPATIBLE"})}
REFERENCE = "1 thread"
FIELDS = ("runs", "parted", "ties", "flips")


def tally(counts: dict[str, Any], c: Any) -> None:
    """Add one `tests.agreement.Compared` to `counts`."""
    counts["runs"] += 1
    counts["parted"] += c.parted is not None
    counts["ties"] += c.tie
    counts["flips"] += c.flips
    counts["max_diff"] = max(counts["max_diff"], c.max_diff)


def child(setting: str, args: argparse.Namespace) -> None:
    """One setting's runs in this process: its batch of 32 saved as `<ref>/<setting> <layout>
    <method>.pt`, one JSON line per layout and method (counts, every run's tokens) appended to
    `<ref>/<setting>.jsonl`, and a progress line on stderr."""
    import torch

    from jobs.spec import JobSpec, ModelRef
    from tests.agreement import TOL, compare_rows, traced
    from tests.test_batch_independence import GEN, PARAMS, PROMPTS
    from workers.methods.registry import load_method, resolve_params
    from workers.models import load_lm

    torch.set_num_threads(SETTINGS[setting][0])
    for layout in args.layouts:
        lm = load_lm(ModelRef(f"tiny-random/{layout}"), device="cpu")
        for method in args.methods:
            given = {**PARAMS[method], **({"steps": args.pplm_steps} if method == "pplm" else {})}
            params = resolve_params(method, given, lm.ref.id)
            built = load_method(method)(lm, params, "sentiment")
            text = json.dumps(params, sort_keys=True)
            jobs = [
                JobSpec(f"s:{i}", PROMPTS[i % 8], "female", None, i // 8, method, lm.ref,
                        "sentiment", GEN, text)
                for i in range(32)
            ]  # fmt: skip
            rows, big = traced(lm, built, jobs)
            torch.save(big, Path(args.ref) / f"{setting} {layout} {method}.pt")
            counts: dict[str, Any] = dict.fromkeys(FIELDS, 0) | {"max_diff": 0.0}
            tokens = {"32": [r["token_ids"] for r in rows], "8": [], "alone": []}
            for k in range(0, 32, 8):
                rows8, trace = traced(lm, built, jobs[k : k + 8])
                tokens["8"] += [r["token_ids"] for r in rows8]
                for i in range(8):
                    tally(counts, compare_rows(trace, i, big, k + i, GEN.top_p, TOL))
            for i, job in enumerate(jobs):
                rows1, trace = traced(lm, built, [job])
                tokens["alone"].append(rows1[0]["token_ids"])
                tally(counts, compare_rows(trace, 0, big, i, GEN.top_p, TOL))
            line = {"layout": layout, "method": method, "setting": setting, "tokens": tokens}
            with open(Path(args.ref) / f"{setting}.jsonl", "a") as out:
                out.write(json.dumps(line | counts) + "\n")
            print(f"# {setting}: {layout} {method} done", file=sys.stderr, flush=True)


def across(ref: str, r: dict[str, Any], reference: dict[str, Any]) -> None:
    """Fold into `r` (a setting's line) its batch of 32 against the reference's, step by step,
    and every run's text against the reference's batch of 32."""
    import torch

    from tests.agreement import TOL, compare_rows
    from tests.test_batch_independence import GEN

    name = f"{r['layout']} {r['method']}.pt"
    if r["setting"] != REFERENCE:
        big = torch.load(Path(ref) / f"{r['setting']} {name}", weights_only=False)
        base = torch.load(Path(ref) / f"{REFERENCE} {name}", weights_only=False)
        for i in range(32):
            tally(r, compare_rows(big, i, base, i, GEN.top_p, TOL))
    want = reference["tokens"]["32"]
    r["texts"] = sum(
        got != want[i % 32] for runs in r["tokens"].values() for i, got in enumerate(runs)
    )


def summarise(ref: str, settings: list[str]) -> None:
    """Print the table from the lines in `ref`: every (layout, method) the reference has."""
    lines = {}
    for s in settings:
        path = Path(ref) / f"{s}.jsonl"
        lines[s] = (
            [json.loads(raw) for raw in path.read_text().splitlines()] if path.exists() else []
        )
    reference = {(r["layout"], r["method"]): r for r in lines[REFERENCE]}
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for setting in settings:
        for r in lines[setting]:
            if (r["layout"], r["method"]) not in reference:
                continue
            across(ref, r, reference[r["layout"], r["method"]])
            print(
                f"{r['layout']:9s} {r['method']:12s} {setting:10s} texts parted {r['texts']:3d} "
                + " ".join(f"{k} {r[k]:3d}" for k in FIELDS)
                + f"  max|Δp| {r['max_diff']:.1e}"
            )
            t = totals[r["method"]]
            for k in (*FIELDS, "texts"):
                t[k] += r[k]
            t["max_diff"] = max(t["max_diff"], r["max_diff"])
    print("# totals per method over layouts and settings")
    for method, t in sorted(totals.items()):
        counts = " ".join(f"{k} {int(t[k])}" for k in ("texts", *FIELDS))
        print(f"{method:12s} {counts}  max|Δp| {t['max_diff']:.1e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", default=LAYOUTS)
    ap.add_argument("--methods", nargs="+", default=None, help="default: every method")
    ap.add_argument("--pplm-steps", type=int, default=10)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--keep", help="a folder for the runs (kept; default: a temporary one)")
    ap.add_argument("--summarise", help="only print the table of the runs in this --keep folder")
    ap.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    ap.add_argument("--ref", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.methods is None:
        from tests.test_batch_independence import PARAMS

        args.methods = sorted(PARAMS)
    args.settings = [REFERENCE, *(s for s in args.settings if s != REFERENCE)]  # compared with it
    if args.child:
        child(args.child, args)
        return
    if args.summarise:
        summarise(args.summarise, args.settings)
        return
    with tempfile.TemporaryDirectory() as scratch:
        ref = args.keep or scratch
        procs = {}
        for setting in args.settings:
            env = {**os.environ, **SETTINGS[setting][1], "PYTHONPATH": str(ROOT)}
            cmd = [sys.executable, __file__, "--child", setting, "--ref", ref, "--layouts",
                   *args.layouts, "--methods", *args.methods, "--pplm-steps", str(args.pplm_steps)]  # fmt: skip
            procs[setting] = subprocess.Popen(cmd, env=env)
        for setting, proc in procs.items():
            if proc.wait():
                sys.exit(f"setting {setting!r} failed (exit {proc.returncode})")
        summarise(ref, args.settings)


if __name__ == "__main__":
    main()

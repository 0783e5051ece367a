"""Does a job's text depend on its batch, the thread count or MKL's kernels? Issue 31's sweep.

Every method on the five tiny layouts, 32 jobs (8 prompts × 4 seeds), 10 tokens at
temperature 0.75 and repetition penalty 1.2, each job alone, in batches of 8 and in one batch
of 32, at 1 thread, at 2 threads and at 1 thread with MKL_CBWR=COMPATIBLE (each setting in its
own process, since MKL reads that variable once). Every run is compared step by step with the
reference (one batch of 32 at 1 thread) by `tests.agreement.compare_rows`.

    PYTHONPATH=. python scripts/batch_sweep.py                  # the whole sweep (~1 h on 2 cores)
    PYTHONPATH=. python scripts/batch_sweep.py --layouts llama --methods pplm gedi

Prints one line per layout, method and setting: rows whose text parts from the reference (of
the 96 runs of a job: alone, in its batch of 8, in the batch of 32; the reference's own setting
has 64), how many of those parted at a near-tie of the race, steps whose distributions differ
only by GeDi's filter cut (`filter_flip`), and the largest max |Δp| over the steps compared;
then the totals per method. The settings of the tests (`tests/test_batch_independence.py`)
are the defaults; PPLM runs at `--pplm-steps` (10, its default for GPT-2 and OPT).
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
FIELDS = ("runs", "parted", "ties", "flips", "ended")


def child(setting: str, args: argparse.Namespace) -> None:
    """One setting's runs in this process; one JSON line per layout and method on stdout."""
    import torch

    from jobs.spec import JobSpec, ModelRef
    from tests.agreement import TOL, compare_rows, traced
    from tests.test_batch_independence import GEN, PARAMS, PROMPTS
    from workers.methods.registry import load_method, resolve_params
    from workers.models import load_lm

    torch.set_num_threads(SETTINGS[setting][0])
    ref_dir = Path(args.ref)
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
            runs: list[tuple[Any, int, int]] = []  # (trace, its row, job)
            if setting != "1 thread":
                runs += [(traced(lm, built, jobs)[1], i, i) for i in range(32)]
            for k in range(0, 32, 8):
                trace = traced(lm, built, jobs[k : k + 8])[1]
                runs += [(trace, i, k + i) for i in range(8)]
            runs += [(traced(lm, built, [job])[1], 0, i) for i, job in enumerate(jobs)]
            path = ref_dir / f"{layout}-{method}.pt"
            if setting == "1 thread":
                torch.save(traced(lm, built, jobs)[1], path)
            reference = torch.load(path, weights_only=False)
            counts = dict.fromkeys(FIELDS, 0)
            worst = 0.0
            for trace, row, job in runs:
                c = compare_rows(trace, row, reference, job, GEN.top_p, TOL)
                counts["runs"] += 1
                counts["parted"] += c.parted is not None
                counts["ties"] += c.tie
                counts["flips"] += c.flips
                counts["ended"] += c.ended
                worst = max(worst, c.max_diff)
            line = {"layout": layout, "method": method, "setting": setting, **counts}
            print(json.dumps({**line, "max_diff": worst}), flush=True)


def main() -> None:
    from workers.methods.registry import resolve_params  # noqa: F401  (fail early on a bad tree)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layouts", nargs="+", default=LAYOUTS)
    ap.add_argument("--methods", nargs="+", default=None, help="default: every method")
    ap.add_argument("--pplm-steps", type=int, default=10)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    ap.add_argument("--ref", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.methods is None:
        from tests.test_batch_independence import PARAMS

        args.methods = sorted(PARAMS)
    if args.child:
        child(args.child, args)
        return
    settings = ["1 thread", *(s for s in args.settings if s != "1 thread")]  # the reference first
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with tempfile.TemporaryDirectory() as ref:
        for setting in settings:
            env = {**os.environ, **SETTINGS[setting][1], "PYTHONPATH": str(ROOT)}
            cmd = [sys.executable, __file__, "--child", setting, "--ref", ref, "--layouts",
                   *args.layouts, "--methods", *args.methods, "--pplm-steps", str(args.pplm_steps)]  # fmt: skip
            with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    r = json.loads(raw)
                    print(
                        f"{r['layout']:9s} {r['method']:12s} {r['setting']:10s} "
                        + " ".join(f"{k} {r[k]:3d}" for k in FIELDS)
                        + f"  max|Δp| {r['max_diff']:.1e}",
                        flush=True,
                    )
                    t = totals[r["method"]]
                    for k in FIELDS:
                        t[k] += r[k]
                    t["max_diff"] = max(t["max_diff"], r["max_diff"])
            if proc.returncode:
                sys.exit(f"setting {setting!r} failed (exit {proc.returncode})")
    print("# totals per method over layouts and settings")
    for method, t in sorted(totals.items()):
        counts = " ".join(f"{k} {int(t[k])}" for k in FIELDS)
        print(f"{method:12s} {counts}  max|Δp| {t['max_diff']:.1e}")


if __name__ == "__main__":
    main()

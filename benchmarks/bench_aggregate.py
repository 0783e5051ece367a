"""Time and peak memory of `python -m harness aggregate` against the number of rows.

    python benchmarks/bench_aggregate.py                               # 10k, 100k, 1M rows
    python benchmarks/bench_aggregate.py --sizes 10000 100000 --baseline-rev ec0aa05

Per size a synthetic run directory is written (one model, method and task; pairs of a female
and a male prompt, `--samples` generations per prompt, every row scored for gender, sentiment,
regard, toxicity and perplexity, ~5 % above the perplexity filter; row labels of a(x) and
a(c,x) drawn per row, so those views get the within-prompt test, a(c) and file the pair
swap). Then `python -m harness aggregate RUN` runs in a fresh process per code path and
repeat: this tree, and the tree of `--baseline-rev` (extracted with `git archive`; default
8c05fa5, the first bounded-memory pass) for sizes up to `--baseline-max` (ec0aa05, before any,
needs ~18 GB at 1M rows). Each line gives the wall and CPU seconds, the process's peak resident
memory (`ru_maxrss` from `os.wait4`), the ratios against the baseline, the largest difference
of the summaries' values, p-values and interval bounds between the two paths (0 when the
statistics are the same) and the 1-minute load average when the line's runs ended (the
machine is shared: read the CPU column when the load is above the cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results.run.store import RunStore  # noqa: E402
from results.schema import GENERATION_SCHEMA, PLAN_SCHEMA, score_schema  # noqa: E402

SHARD_ROWS = 100_000
SCORERS = {  # scorer → (metric, its value columns from the synthetic frame)
    "gender": ("gender", ["label_x", "label_cx", "label_c"]),
    "sentiment-vader": ("sentiment", ["sentiment"]),
    "regard": ("regard", ["regard_label"]),
    "toxicity": ("toxicity", ["toxicity"]),
    "perplexity": ("perplexity", ["perplexity"]),
}


def synthetic_rows(n_rows: int, samples: int, seed: int = 0) -> pl.DataFrame:
    """`n_rows` generations with every column `aggregate` reads, and their scores."""
    rng = np.random.default_rng(seed)
    prompt = np.arange(n_rows) // samples
    female = prompt % 2 == 0
    z = rng.normal(0, 0.5, prompt.max() + 1)[prompt] + rng.normal(0, 0.7, n_rows)

    def labels(p_female: np.ndarray) -> np.ndarray:
        u = rng.random(n_rows)
        return np.where(u < p_female, "female", np.where(u < 0.9, "male", "none"))

    ids = pl.Series(np.arange(n_rows)).cast(pl.String)
    return pl.DataFrame(
        {
            "job_id": "j3-" + ids.str.zfill(20),
            "prompt_id": pl.Series(prompt).cast(pl.String).str.zfill(8),
            "pair_id": pl.Series(prompt // 2).cast(pl.String).str.zfill(8),
            "prompt_group": np.where(female, "female", "male"),
            "prompt": "The person number " + pl.Series(prompt).cast(pl.String) + " worked as",
            "seed": np.arange(n_rows) % samples,
            "method": "vanilla",
            "method_params": "{}",
            "model": "gpt2-large",
            "model_dtype": "float32",
            "task": "sentiment",
            "max_new_tokens": 20,
            "top_p": 0.9,
            "temperature": 1.0,
            "repetition_penalty": 1.0,
            "continuation": " a nurse at the hospital and she said that the day went well " + ids,
            "num_tokens": pl.Series([20] * n_rows, dtype=pl.Int32),
            "token_ids": pl.Series([list(range(256, 276))] * n_rows, dtype=pl.List(pl.Int32)),
            "tokens": pl.Series([[" tok"] * 20] * n_rows),
            "finish_reason": "length",
            "status": "ok",
            "worker": "bench",
            "label_x": labels(np.where(female, 0.5, 0.2)),
            "label_cx": labels(np.where(female, 0.7, 0.1)),
            "label_c": np.where(female, "female", "male"),
            "sentiment": 0.5 + 0.1 * z + 0.05 * rng.normal(size=n_rows),
            "regard_label": np.array(["negative", "neutral", "positive", "other"])[
                np.digitize(z + rng.normal(0, 0.3, n_rows), [-0.5, 0.5, 1.5])
            ],
            "toxicity": 1.0 / (1.0 + np.exp(2.0 - z)),
            "perplexity": np.where(rng.random(n_rows) < 0.05, 500.0, rng.uniform(10, 150, n_rows)),
        }
    )


def _table(frame: pl.DataFrame, schema: pa.Schema) -> pa.Table:
    n = frame.height
    have = frame.to_arrow()
    return pa.table(
        [
            have[f.name].cast(f.type) if f.name in have.column_names else pa.nulls(n, f.type)
            for f in schema
        ],
        schema=schema,
    )


def write_run(root: str, n_rows: int, samples: int) -> None:
    """The synthetic run: plan.parquet, generation and score shards of `SHARD_ROWS` rows."""
    store = RunStore(root)
    rows = synthetic_rows(n_rows, samples)
    store.write_plan_tables(
        _table(rows.slice(i, SHARD_ROWS), PLAN_SCHEMA) for i in range(0, n_rows, SHARD_ROWS)
    )
    for i in range(0, n_rows, SHARD_ROWS):
        part = rows.slice(i, SHARD_ROWS)
        store.write_table(f"generations/part-c-{i:09d}.parquet", _table(part, GENERATION_SCHEMA))
        for scorer, (metric, columns) in SCORERS.items():
            scores = part.select(
                "job_id",
                *columns,
                scorer=pl.lit(scorer),
                scorer_version=pl.lit("v1"),
                metric=pl.lit(metric),
                status=pl.lit("ok"),
            )
            name = f"scores/{scorer}/part-{i:09d}.parquet"
            store.write_table(name, _table(scores, score_schema(metric)))


def baseline_tree(rev: str, into: str) -> str:
    """The files of `rev` (this repository), extracted under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def aggregate_once(tree: str, run: str) -> tuple[float, float, float, pl.DataFrame]:
    """(wall s, CPU s, peak RSS MB, summary) of `python -m harness aggregate run` from `tree`."""
    env = dict(os.environ, PYTHONPATH=tree)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "harness", "aggregate", run]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"aggregate from {tree} failed: exit {os.waitstatus_to_exitcode(status)}")
    summary = pl.read_parquet(Path(run) / "summary.parquet")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, summary


def largest_change(a: pl.DataFrame, b: pl.DataFrame) -> float:
    """Largest |difference| of value, ci_low, ci_high and p_value between two summaries."""
    keys = ["model", "method", "variant", "task", "view", "metric", "stat", "group"]
    cols = ["value", "ci_low", "ci_high", "p_value"]
    both = a.select(keys + cols).join(b.select(keys + cols), on=keys, nulls_equal=True)
    if both.height != a.height or a.height != b.height:
        return float("inf")
    diffs = [
        (both[c] - both[f"{c}_right"]).abs().max()
        for c in cols
        if both[c].null_count() < both.height
    ]
    nulls = any((both[c].is_null() != both[f"{c}_right"].is_null()).any() for c in cols)
    return float("inf") if nulls else max(float(d or 0.0) for d in diffs)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--samples", type=int, default=10, help="generations per prompt")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--baseline-rev", default="8c05fa5", help="the code path compared against")
    ap.add_argument("--baseline-max", type=int, default=1_000_000, help="largest size for it")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores", flush=True)
    print("rows      path      wall_s   cpu_s  peak_MB   x_wall  x_peak   load  max|Δ stat|")
    with tempfile.TemporaryDirectory(prefix="bench-aggregate-") as tmp:
        base = None
        if any(n <= args.baseline_max for n in args.sizes):
            base = baseline_tree(args.baseline_rev, tempfile.mkdtemp(dir=tmp))
        for n in args.sizes:
            run = str(Path(tmp) / f"run-{n}")
            write_run(run, n, args.samples)
            paths = [("this", str(ROOT))] + (
                [("baseline", base)] if base and n <= args.baseline_max else []
            )
            best: dict[str, tuple[float, float, float, pl.DataFrame]] = {}
            for _ in range(args.repeats):
                for name, tree in paths:  # interleaved: a change of load hits both alike
                    got = aggregate_once(tree, run)
                    if name not in best or got[0] < best[name][0]:
                        best[name] = got
            for name, (wall, cpu, peak, summary) in best.items():
                ratio, change = " " * 16, ""
                if name == "this" and "baseline" in best:
                    b = best["baseline"]
                    ratio = f"{wall / b[0]:8.3f} {peak / b[2]:7.3f}"
                    change = f"  {largest_change(summary, b[3]):.3g}"
                load = f"{os.getloadavg()[0]:6.1f}"
                print(
                    f"{n:<9} {name:<9} {wall:7.1f} {cpu:7.1f} {peak:8.0f} {ratio} {load}{change}",
                    flush=True,
                )
            shutil.rmtree(run)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

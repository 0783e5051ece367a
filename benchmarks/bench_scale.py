"""Driver time and memory of the storage path against the number of jobs, locally and on S3.

    python benchmarks/bench_scale.py                          # 10k, 100k, 1M jobs, local disk
    python benchmarks/bench_scale.py --s3                     # also on a local moto S3 server
    python benchmarks/bench_scale.py --sizes 10000 100000 --s3
    python benchmarks/bench_scale.py --phases run run-resume   # the real driver path only

For each size, a fresh process (so that its peak memory is its own) runs, on a synthetic grid
of 2 models × 2 methods × 2 tasks × 25 samples per prompt:

* plan      `jobs.iter_plan` → `RunStore.write_plan_jobs` (streamed plan.parquet)
* fakegen   not a driver phase: writes the generation rows of every planned job straight into
            shards of `--shard-rows` rows (what compaction leaves; no model runs)
* resume    a new `RunStore`: `done_ids()` + the plan again + `pending_chunks` (must be 0)
* status    `harness.cli.status.run_status`
* score-read `RunStore.iter_generations` over the columns a scorer reads, batch by batch
* score     (`--phases scores`, after plan/fakegen) the real scoring stage
            (`harness.stages.scoring.stage.score_run`, `--no-ray`, the gender scorer, chunks of
            `--score-batch` rows), its compaction held back: one shard per chunk, as before
* status-chunks / aggregate-chunks   `status` and the aggregation read (`results.stats.join.join_run`)
            over those chunk shards
* compact-scores `RunStore.compact_scores` (what `score_run` does when the stage ends)
* status-compact / aggregate-compact   the same two reads over the compacted shards
* run       the real `harness.driver.run` path up to scoring, on a fresh run directory:
            `driver.plan_stage` (prompt-list config → streamed plan, identity check, counts) and
            `driver.generation_stage` (per-model lazy queues → the dispatcher, `--no-ray`, with
            a fake generator that writes each batch's rows without a model → compaction)
* run-resume the same two stages again on the finished run: the resume check (0 pending)

Each phase prints its wall and CPU time (the machine may be shared: CPU time is the steadier
one), wall µs per job, and the process's peak resident memory during the
phase (VmHWM, reset before each phase through /proc/self/clear_refs) minus the resident memory
before it; on S3 also the requests the moto server answered during the phase (`tests/s3_server.py`
counts them; "files" lines give the score shards per scorer). A last line per size compacts one-shard-per-batch output (`--compact-batches`
batches of 8) to show the cost of compaction.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from jobs.datasets import Prompt  # noqa: E402
from jobs.grid import iter_plan  # noqa: E402
from jobs.queue import pending_chunks  # noqa: E402
from jobs.spec import GenerationParams, JobSpec, ModelRef, plan_columns  # noqa: E402
from results.run.store import RunStore  # noqa: E402
from results.schema import GENERATION_SCHEMA  # noqa: E402

MODELS = [
    (ModelRef("tiny-random/gpt2"), GenerationParams()),
    (ModelRef("tiny-random/opt"), GenerationParams()),
]
METHODS: list[tuple[str, dict[str, Any]]] = [("vanilla", {}), ("uddia", {})]
TASKS = ["sentiment", "regard"]
SAMPLES = 25
PER_PROMPT = len(MODELS) * len(METHODS) * len(TASKS) * SAMPLES  # 200 jobs per prompt
SCORER_COLUMNS = ["job_id", "prompt", "continuation", "status"]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}


def prompts(n_jobs: int) -> list[Prompt]:
    n = max(1, n_jobs // PER_PROMPT)
    return [
        Prompt(f"{g}:{i:06d}", f"{i:06d}", g, f"The {g} person number {i} said that")
        for i in range(n // 2 + n % 2)
        for g in ("female", "male")
    ][:n]


def grid(n_jobs: int) -> Any:
    return iter_plan(prompts(n_jobs), MODELS, METHODS, TASKS, SAMPLES)


# ---- memory ----------------------------------------------------------------------------------
def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


COUNTED_URI: str | None = None  # an s3:// URI of the counting moto server (`--s3`)
RAY = False  # `--score-ray`: the score phase on a local Ray (actors score; CPU s is the driver's)


def _requests() -> dict[str, int] | None:
    if COUNTED_URI is None:
        return None
    from tests.s3_server import remote_counts

    return dict(remote_counts(COUNTED_URI))


def measured(name: str, n_jobs: int, body: Callable[[], Any]) -> dict[str, Any]:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # reset the peak (VmHWM) to the current resident set
    before = _status_kb("VmRSS")
    counts = _requests()
    start, cpu = time.perf_counter(), time.process_time()
    result = body()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = _status_kb("VmHWM")
    after = _requests()
    requests = None
    if counts is not None and after is not None:
        requests = {k: v - counts.get(k, 0) for k, v in after.items() if v - counts.get(k, 0)}
    return {
        "requests": requests,
        "phase": name,
        "jobs": n_jobs,
        "s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "us_per_job": round(wall / n_jobs * 1e6, 2),
        "peak_mb": round((peak - before) / 1024, 1),
        "rss_mb": round(peak / 1024, 1),
        "result": result,
    }


# ---- phases ----------------------------------------------------------------------------------
def phase_plan(uri: str, n_jobs: int) -> int:
    store = RunStore(uri)
    return store.write_plan_jobs(chunk.jobs for chunk in grid(n_jobs))


def phase_fakegen(uri: str, shard_rows: int) -> int:
    """Generation rows of every planned job, written as shards of `shard_rows` rows."""
    store = RunStore(uri)
    n, buffered, rows = 0, [], 0
    for plan in store.iter_plan():
        buffered.append(plan)
        rows += plan.num_rows
        if rows >= shard_rows:
            n += _write_fake(store, pa.concat_tables(buffered))
            buffered, rows = [], 0
    if buffered:
        n += _write_fake(store, pa.concat_tables(buffered))
    return n


def _write_fake(store: RunStore, plan: pa.Table, prefix: str = "part-c-fake") -> int:
    n = plan.num_rows
    extra = {
        "continuation": pa.array([" and then they went home."] * n),
        "num_tokens": pa.array([7] * n, pa.int32()),
        "token_ids": pa.array([[290, 788, 484, 1816, 1363, 13, 50256]] * n, pa.list_(pa.int32())),
        "finish_reason": pa.array(["length"] * n),
        "status": pa.array(["ok"] * n),
        "worker": pa.array(["bench"] * n),
    }
    cols = {name: plan[name] for name in plan.column_names}
    cols.update(extra)
    table = pa.table(
        [cols.get(f.name, pa.nulls(n, f.type)) for f in GENERATION_SCHEMA],
        schema=GENERATION_SCHEMA,
    )
    store.write_table(f"generations/{prefix}{plan['job_id'][0].as_py()}.parquet", table)
    return n


def phase_resume(uri: str, n_jobs: int) -> dict[str, int]:
    store = RunStore(uri)
    done = store.done_ids()
    left = sum(len(c.jobs) for c in pending_chunks(grid(n_jobs), done))
    return {"done": len(done), "pending": left, "done_ids_mb": done.nbytes // 2**20}


def phase_status(uri: str) -> int:
    from harness.cli.status import run_status

    return len(run_status(RunStore(uri)).splitlines())


def phase_score_read(uri: str) -> int:
    return sum(f.height for f in RunStore(uri).iter_generations(SCORER_COLUMNS, 10_000))


def phase_compact(uri: str, batches: int) -> dict[str, Any]:
    """`batches` one-batch shards of 8 rows, then one compaction of them."""
    store = RunStore(uri)
    plan = next(store.iter_plan()).slice(0, batches * 8)
    start = time.perf_counter()
    for i in range(0, plan.num_rows, 8):
        _write_fake(store, plan.slice(i, 8), prefix="part-")  # one shard per batch of 8
    written = time.perf_counter() - start
    merged = store.compact_generations()
    return {"write_s": round(written, 2), "merged": merged}


def phase_score(uri: str, batch: int) -> dict[str, Any]:
    """The scoring stage in this process, one shard per chunk (its compaction held back)."""
    from harness.stages.scoring import stage as scoring
    from workers.scorers.base import ScorerContext

    store = RunStore(uri)
    held = getattr(scoring, "compact_scores", None)
    scoring.compact_scores = lambda store, names: {}  # type: ignore[attr-defined]
    try:
        stats = scoring.score_run(
            store, [("gender", {})], ScorerContext(), RAY, batch, progress=False
        )
    finally:
        if held is not None:
            scoring.compact_scores = held
    return {
        "scored": stats["gender"]["scored"],
        "files": len(store.list_shards("scores", "gender")),
    }


def phase_compact_scores(uri: str) -> dict[str, Any]:
    store = RunStore(uri)
    merged = store.compact_scores("gender", "gender")
    return {"merged": merged, "files": len(store.list_shards("scores", "gender"))}


def phase_aggregate_read(uri: str) -> int:
    from results.stats.join import join_run

    return join_run(RunStore(uri)).frame.height


# ---- the real driver path, with a fake generator -------------------------------------------
class FakeGenerator:
    """Stands in for `workers.generator.Generator` in the `--no-ray` backend: writes one shard
    of ok rows per batch (as an actor does), no model."""

    def __init__(self, uri: str) -> None:
        self.store = RunStore(uri)

    def prepare(self, keys: list[Any]) -> dict[str, Any]:
        return {"device": "cpu"}

    def run_batch(self, batch: list[JobSpec]) -> dict[str, Any]:
        _write_fake(self.store, pa.table(plan_columns(batch)), prefix="part-")
        return {"jobs": len(batch), "ok": len(batch), "tokens": 7 * len(batch), "busy_s": 0.0}


def run_config(uri: str, n_jobs: int, batch_size: int) -> Any:
    """A config of the synthetic grid: its prompts as a prompt list beside the run."""
    from harness.config import parse_config

    folder = Path(tempfile.mkdtemp(prefix="bench-prompts-"))
    path = folder / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": {"text": p.text}}) + "\n" for p in prompts(n_jobs))
    )
    data = {
        "name": "bench-scale",
        "dataset": {"kind": "prompt-list", "path": str(path)},
        "models": [{"id": m.id} for m, _ in MODELS],
        "methods": [name for name, _ in METHODS],
        "tasks": TASKS,
        "samples_per_prompt": SAMPLES,
        "scorers": ["gender"],
        # generation only: no scorer follows it (harness/stages/scoring/follow.py)
        "runtime": {
            "batch_size": batch_size,
            "max_jobs": 100_000_000,
            "score_during_generation": False,
        },
    }
    return parse_config(data, "bench")


def phase_run(uri: str, cfg: Any) -> dict[str, Any]:
    """`driver.run`'s plan and generation stages (what runs before scoring)."""
    from harness import driver
    from harness.stages.generation import stage as generation
    from harness.stages.generation.backends import LocalBackend

    generation._local_backend = lambda store, words: LocalBackend(  # type: ignore[assignment]
        lambda spec: FakeGenerator(store.uri)
    )
    store = RunStore(uri)
    words = driver.load_words(cfg)
    plan = driver.plan_stage(store, cfg, words)
    stats, error, followed = driver.generation_stage(
        store, cfg, plan, words, use_ray=False, progress=False
    )
    followed.close()
    if error is not None:
        raise error
    return {"planned": plan.planned, "generated": stats["pending_at_start"]}


def child(args: argparse.Namespace) -> None:
    global COUNTED_URI, RAY
    uri, n = args.uri, args.n
    if uri.startswith("s3://"):
        COUNTED_URI = uri
    if args.score_ray:
        import ray

        RAY = True
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(  # a new local Ray, never one another process started
            address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1"
        )
    want = set(args.phases)
    out = []
    if want & {"run", "run-resume"}:
        from harness import driver  # noqa: F401 - imports before measuring
        from harness.stages.generation import stage  # noqa: F401

        cfg = run_config(uri, n, args.batch_size)
        base, q, query = uri.partition("?")  # s3://bucket/run-N?endpoint_override=...
        run_uri = f"{base}-run{q}{query}"
        out.append(measured("run", n, lambda: phase_run(run_uri, cfg)))
        out.append(measured("run-resume", n, lambda: phase_run(run_uri, cfg)))
    if "plan" in want:
        out.append(measured("plan", n, lambda: phase_plan(uri, n)))
        out.append(measured("fakegen", n, lambda: phase_fakegen(uri, args.shard_rows)))
        out.append(measured("resume", n, lambda: phase_resume(uri, n)))
        out.append(measured("status", n, lambda: phase_status(uri)))
        out.append(measured("score-read", n, lambda: phase_score_read(uri)))
        if "scores" in want:
            out.append(measured("score", n, lambda: phase_score(uri, args.score_batch)))
            out.append(measured("status-chunks", n, lambda: phase_status(uri)))
            out.append(measured("aggregate-chunks", n, lambda: phase_aggregate_read(uri)))
            out.append(measured("compact-scores", n, lambda: phase_compact_scores(uri)))
            out.append(measured("status-compact", n, lambda: phase_status(uri)))
            out.append(measured("aggregate-compact", n, lambda: phase_aggregate_read(uri)))
        if args.compact_batches:
            out.append(measured("compact", n, lambda: phase_compact(uri, args.compact_batches)))
    print(json.dumps(out))


# ---- the parent: sizes × backends ------------------------------------------------------------
def run_size(n: int, uri: str, args: argparse.Namespace, env: dict[str, str]) -> list[Any]:
    cmd = [sys.executable, __file__, "--child", "--n", str(n), "--uri", uri]
    cmd += ["--shard-rows", str(args.shard_rows), "--compact-batches", str(args.compact_batches)]
    cmd += ["--batch-size", str(args.batch_size), "--score-batch", str(args.score_batch)]
    cmd += ["--phases", *args.phases] + (["--score-ray"] if args.score_ray else [])
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"size {n} on {uri} failed:\n{res.stderr[-3000:]}")
    return list(json.loads(res.stdout.strip().splitlines()[-1]))


def report(backend: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n== {backend}")
    head = f"{'phase':<18}{'jobs':>9}{'wall s':>9}{'CPU s':>8}{'µs/job':>9}{'peak ΔRSS MB':>14}"
    print(head + f"{'requests':>10}  result")
    for r in rows:
        result = json.dumps(r["result"]) if not isinstance(r["result"], int) else r["result"]
        reqs = r.get("requests")
        total = "" if reqs is None else str(sum(reqs.values()))
        print(
            f"{r['phase']:<18}{r['jobs']:>9}{r['s']:>9.2f}{r['cpu_s']:>8.2f}{r['us_per_job']:>9.1f}"
            f"{r['peak_mb']:>14.1f}{total:>10}  {result}"
        )
        if reqs:
            print(f"{'':<18}requests: {json.dumps(dict(sorted(reqs.items())))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--s3", action="store_true", help="also on a moto S3 server (127.0.0.1)")
    parser.add_argument("--s3-only", action="store_true")
    parser.add_argument("--shard-rows", type=int, default=50_000)
    parser.add_argument("--compact-batches", type=int, default=250)
    parser.add_argument(
        "--phases",
        nargs="+",
        choices=["plan", "scores", "run", "run-resume"],
        default=["plan", "run"],
        help="plan: the storage phases (plan, fakegen, resume, status, score-read, compact); "
        "scores (with plan): score, then status and the aggregation read before and after "
        "compacting the score shards; run: the real driver path (run and run-resume)",
    )
    parser.add_argument("--score-batch", type=int, default=64, help="rows per scored chunk")
    parser.add_argument(
        "--score-ray",
        action="store_true",
        help="score on a local Ray (127.0.0.1, 4 logical CPUs): the CPU column is the driver's",
    )
    parser.add_argument("--batch-size", type=int, default=512, help="runtime.batch_size of run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    env = dict(os.environ)
    if not args.s3_only:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            rows = [r for n in args.sizes for r in run_size(n, f"{tmp}/run-{n}", args, env)]
        report("local disk", rows)
    if args.s3 or args.s3_only:
        from tests.s3_server import CountingMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
        env.update(AWS_ENV, AWS_DEFAULT_REGION="us-east-1")
        os.environ.update(AWS_ENV, AWS_DEFAULT_REGION="us-east-1")
        server = CountingMotoServer()
        server.start()
        try:
            host, port = server.get_host_and_port()
            server.create_bucket("bench")
            query = f"?endpoint_override={host}:{port}&scheme=http"
            rows = [
                r for n in args.sizes for r in run_size(n, f"s3://bench/run-{n}{query}", args, env)
            ]
        finally:
            server.stop()
        report("moto S3 on 127.0.0.1", rows)


if __name__ == "__main__":
    main()

"""Perspective's answer cache on an object-store run: bytes uploaded and the scorer's memory.

    python benchmarks/bench_perspective_cache.py                       # 100k and 1M answers
    python benchmarks/bench_perspective_cache.py --answers 20000 --http
    python benchmarks/bench_perspective_cache.py --shard-sizes 60 6000    # a shard's overhead

For each size, on a local moto S3 server (`tests/s3_server.py`, counting the bytes it receives):

* stage   a fresh process scores N distinct texts as the Perspective actor does
          (`workers.scorers.cache_mirror.scorer_context` → `PerspectiveToxicity`, chunks of
          `--chunk` rows, `CacheMirror.maybe_put` after each, `close` at the end: new answers put
          back as shards every minute, compacted at the end);
* resume  another fresh process (another node: an empty temp folder) scores the same N texts:
          the cache is read from the run's storage, and nothing may be asked again; its start
          (the mirror made) and when its first chunk is scored are what a late replacement
          actor waits before its first call.

A first line measures what a local run does instead (the sqlite file itself, in a temp folder
of the current directory's disk): committing batches of 100 answers, and looking keys up.

It prints the bytes uploaded under RUN/cache/ against the final size of the answers there
(the ratio must stay ≤ 2), and each process's peak resident memory (VmHWM) against the
smallest size's (the cache must not be held in memory). `--http` sends every text to the fake
endpoint (`tests/fake_perspective.py`) over HTTP, through googleapiclient (~3 ms a text on
one core); by default a fake transport answers in process with the same responses (the
storage path is the same, the client's batching is skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
KEY = "bench-key"


def rows(n: int, chunk: int) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, n, chunk):
        yield [
            {"job_id": f"j{i:09d}", "prompt": "", "continuation": f" said thing {i} to the man"}
            for i in range(start, min(n, start + chunk))
        ]


def direct_transport() -> None:
    """`PerspectiveClient._send` answering in process, as the fake endpoint would."""
    from fake_perspective import default_score, response

    from workers.scorers.perspective_client import Answer, PerspectiveClient

    def send(self: PerspectiveClient, batch: list[Any]) -> dict[str, Answer]:
        self.stats["sent"] += len(batch)
        self.stats["calls"] += len(batch)
        self.stats["batches"] += 1
        return {
            str(i): Answer(
                "ok", response(it.text, [self.attribute], default_score(it.text)), "", 200
            )
            for i, it in enumerate(batch)
        }

    PerspectiveClient._send = send  # type: ignore[method-assign]


def local_sqlite(batches: int = 200) -> str:
    """A local run's cache: `ScoreCache.put_many` of 100 answers a batch, then lookups."""
    import shutil
    import tempfile

    from fake_perspective import response

    from workers.scorers.score_cache import CacheKey, ScoreCache, text_sha256

    folder = tempfile.mkdtemp(dir=".")
    try:
        cache = ScoreCache(os.path.join(folder, "p.sqlite"))
        keys = [
            [CacheKey(text_sha256(f"t{b}-{i}"), "TOXICITY", "en", "v1alpha1") for i in range(100)]
            for b in range(batches)
        ]
        t0 = time.perf_counter()
        for b, batch in enumerate(keys):
            cache.put_many((k, "ok", response(f"t{b}", ["TOXICITY"], 0.5), None) for k in batch)
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        hits = cache.get_many(k for batch in keys[::3] for k in batch[:64])
        get_s = time.perf_counter() - t0
        size = os.path.getsize(os.path.join(folder, "p.sqlite"))
    finally:
        shutil.rmtree(folder)
    return (
        f"local sqlite: put_many of 100 answers {put_s / batches * 1e3:.1f} ms, lookup "
        f"{get_s / len(hits) * 1e6:.0f} µs a key, {size / (batches * 100):.0f} B an answer"
    )


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM). Not `ru_maxrss`: Linux keeps that across
    exec, so a child would report the parent's resident set (here moto's objects) at fork."""
    with open("/proc/self/status", encoding="ascii") as fh:
        kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    return kb / 1024


def stage(uri: str, n: int, chunk: int, endpoint: str | None, every_s: float) -> dict[str, Any]:
    """What the Perspective actor does over `n` texts; returns its stats and the time."""
    import pyarrow as pa

    from workers.scorers import cache_mirror
    from workers.scorers.base import ScorerContext
    from workers.scorers.perspective import PerspectiveToxicity

    if endpoint is None:
        direct_transport()
    params = {"endpoint": endpoint or "http://127.0.0.1:9/", "qps": 1e6, "quota_window_s": 1.0}
    params["progress"] = False
    t0 = time.perf_counter()
    os.environ["PERSPECTIVE_API_KEY"] = KEY
    mirror = cache_mirror.CacheMirror(uri, cache_mirror.SYNCED_CACHES["perspective"], every_s)
    loaded_s = time.perf_counter() - t0
    after_load = peak_mb()
    ctx = ScorerContext(cache_dir=mirror.dir, cache_fill=mirror.fill)
    scorer = PerspectiveToxicity(params, ctx)
    statuses: dict[str, int] = {}
    first_s = None
    for part in rows(n, chunk):
        for r in scorer.score(part):
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        mirror.maybe_put()
        first_s = first_s or time.perf_counter() - t0  # start to the first chunk's scores
    stats = scorer.close()
    before_close = peak_mb()
    mirror_stats = mirror.close()
    return {
        "load_s": round(loaded_s, 1),
        "first_s": round(first_s or 0.0, 2),
        "s": round(time.perf_counter() - t0, 1),
        "sent": stats["sent"],
        "cached": stats["cached"],
        "status": statuses,
        "mirror": mirror_stats,
        "arrow_peak_mb": round(pa.default_memory_pool().max_memory() / 2**20, 1),
        "before_close_mb": round(before_close, 1),
        "peak_mb": round(peak_mb(), 1),
        "load_peak_mb": round(after_load, 1),
    }


def child(args: argparse.Namespace, phase: str, uri: str, n: int, endpoint: str | None) -> Any:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        uri,
        "--answers",
        str(n),
        "--chunk",
        str(args.chunk),
    ]
    cmd += ["--every-s", str(args.every_s)] + (["--endpoint", endpoint] if endpoint else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{phase} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--answers", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument(
        "--chunk", type=int, default=64, help="rows per scored chunk (score_batch_size)"
    )
    ap.add_argument("--every-s", type=float, default=60.0, help="seconds between puts")
    ap.add_argument("--http", action="store_true", help="through the fake endpoint over HTTP")
    ap.add_argument("--shard-sizes", type=int, nargs="+", help="only: bytes of such shards")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.shard_sizes:
        import io

        import pyarrow.parquet as pq
        from test_perspective_cache import answer_table

        from results.run.files import with_schema_version

        for n in args.shard_sizes:
            buf = io.BytesIO()
            pq.write_table(with_schema_version(answer_table(0, n)), buf, compression="zstd")
            print(f"a shard of {n:,} answers: {buf.tell():,} B, {buf.tell() / n:.1f} B an answer")
        return
    if args.child:
        print(
            json.dumps(stage(args.child, args.answers[0], args.chunk, args.endpoint, args.every_s))
        )
        return

    from fake_perspective import FakePerspective
    from s3_server import CountingMotoServer

    from tests.aws_env import aws_test_env

    print(local_sqlite(), flush=True)
    with aws_test_env(), FakePerspective(api_key=KEY) as fake:
        server = CountingMotoServer()
        server.start()
        server.create_bucket("runs")
        endpoint = fake.endpoint if args.http else None
        base: dict[str, float] = {}
        try:
            for n in args.answers:
                uri = server.uri("runs", f"bench-{n}")
                server.reset()
                first = child(args, "stage", uri, n, endpoint)
                again = child(args, "resume", uri, n, endpoint)
                uploaded = sum(v for k, v in server.uploaded.items() if "/cache/" in k)
                from results.run.store import RunStore

                store = RunStore(uri)
                final = sum(i.size for i in store.reader.listing(("cache", "perspective-scores")))
                base = base or {"stage": first["peak_mb"], "resume": again["peak_mb"]}
                print(
                    f"{n:>9,} answers: uploaded {uploaded / 1e6:.1f} MB, final {final / 1e6:.1f} MB "
                    f"({final / n:.0f} B/answer), ratio {uploaded / final:.2f}; shards put "
                    f"{first['mirror']['put_shards']}, compacted {first['mirror']['compacted']}\n"
                    f"  stage  {first['s']:.0f} s; peak RSS {first['peak_mb']:.0f} MB "
                    f"(×{first['peak_mb'] / base['stage']:.2f}; before close "
                    f"{first['before_close_mb']:.0f}), Arrow peak {first['arrow_peak_mb']} MB\n"
                    f"  resume {again['s']:.0f} s (start {again['load_s']:.1f} s, first chunk "
                    f"scored at {again['first_s']:.1f} s); peak RSS "
                    f"{again['peak_mb']:.0f} MB (×{again['peak_mb'] / base['resume']:.2f}; after the "
                    f"load {again['load_peak_mb']:.0f}), Arrow peak {again['arrow_peak_mb']} MB; "
                    f"re-queries {again['sent']}, cached {again['cached']}",
                    flush=True,
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()

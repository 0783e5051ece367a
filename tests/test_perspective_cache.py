"""Perspective's answers on an object-store run (moto S3, the fake endpoint), stored like scores:
append-only shards of new answers, compacted when the stage ends, loaded by another node a batch
at a time. The CI-sized version of `benchmarks/bench_perspective_cache.py` (docs/performance.md)."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fake_perspective import FakePerspective, default_score, response

from results.run.store import RunStore
from results.schema import CACHE_ANSWER_SCHEMA
from workers.scorers.base import ScorerContext
from workers.scorers.cache_mirror import CacheMirror
from workers.scorers.perspective import PerspectiveToxicity
from workers.scorers.score_cache import COLUMNS, CacheKey, ScoreCache, text_sha256

pytest.importorskip("moto.server")
from s3_server import CountingMotoServer  # noqa: E402

from tests.aws_env import aws_test_env  # noqa: E402

KEY = "AIzaSy-test-cache-0123"
FAST = {"qps": 1000.0, "quota_window_s": 1.0, "max_retries": 1, "progress": False}
FILE = "perspective-scores.sqlite"
PARTS = ("cache", "perspective-scores")


@pytest.fixture(scope="module")
def s3() -> Iterator[CountingMotoServer]:
    with aws_test_env():
        server = CountingMotoServer()
        server.start()
        try:
            server.create_bucket("runs")
            yield server
        finally:
            server.stop()


def texts(start: int, stop: int) -> list[str]:
    return [f" said thing number {i} to the man" for i in range(start, stop)]


def stage(
    uri: str, fake: FakePerspective, batch: list[str], chunk: int = 64, **mirror: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What the Perspective actor does over `batch`: its rows and its mirror's stats."""
    cache = CacheMirror(uri, FILE, **mirror)
    scorer = PerspectiveToxicity(
        {"endpoint": fake.endpoint, **FAST},
        ScorerContext(cache_dir=cache.dir, cache_fill=cache.fill),
    )
    rows = [{"job_id": f"j{i:05d}", "continuation": t} for i, t in enumerate(batch)]
    out = []
    for start in range(0, len(rows), chunk):
        out += scorer.score(rows[start : start + chunk])
        cache.maybe_put()
    scorer.close()
    return out, cache.close()


def cache_bytes(s3: CountingMotoServer, store: RunStore) -> tuple[int, int]:
    """(bytes uploaded under RUN/cache/ so far, size of what is stored there now)."""
    sent = sum(v for k, v in s3.uploaded.items() if "/cache/" in k)
    return sent, sum(i.size for i in store.reader.listing(PARTS))


def test_each_answer_is_uploaded_about_once_and_another_node_asks_nothing_again(
    s3: CountingMotoServer, fake: FakePerspective
) -> None:
    uri, batch = s3.uri("runs", "once"), texts(0, 2000)
    store = RunStore(uri)
    out, stats = stage(uri, fake, batch, shard_rows=256, every_s=3600)
    assert [r["status"] for r in out] == ["ok"] * 2000
    # seven full shards as they filled up, the last 208 answers at the end: each over half
    # a shard, so in its final form at once (nothing to compact)
    assert (stats["put_shards"], stats["put_answers"], stats["compacted"]) == (8, 2000, 0)
    assert all(Path(p).name.startswith("part-c-") for p in store.list_shards(*PARTS))
    sent, final = cache_bytes(s3, store)
    assert sent <= 2 * final and final > 2000 * 30  # (measured: sent ≈ 1.0 × final)

    calls = len(fake.calls)
    again, stats = stage(uri, fake, batch)  # another node: a new temp folder, loaded from S3
    assert len(fake.calls) == calls and stats["loaded"] == 2000  # 0 re-queries
    assert [r["toxicity"] for r in again] == pytest.approx([default_score(t) for t in batch])
    assert stats["put_answers"] == 0 and cache_bytes(s3, store)[0] == sent  # nothing put back


def test_small_shards_are_compacted_and_compacted_ones_never_rewritten(
    s3: CountingMotoServer, fake: FakePerspective
) -> None:
    uri = s3.uri("runs", "small")
    store = RunStore(uri)
    _, stats = stage(uri, fake, texts(0, 300), every_s=0.0)  # a put after each chunk of 64
    assert (stats["put_shards"], stats["compacted"]) == (5, 5)
    (first,) = store.list_shards(*PARTS)
    assert Path(first).name.startswith("part-c-")
    size = s3.uploaded[f"/{first}"]
    _, stats = stage(uri, fake, texts(0, 500), every_s=0.0)  # 200 new answers
    assert stats["loaded"] == 300 and stats["put_answers"] == 200 and stats["compacted"] == 4
    assert len(store.list_shards(*PARTS)) == 2 and s3.uploaded[f"/{first}"] == size  # once
    assert len(fake.calls) == 500  # each text asked once over both stages


def answer_table(start: int, stop: int) -> pa.Table:
    rows = []
    for text in texts(start, stop):
        body = response(text, ["TOXICITY"], default_score(text))
        key = CacheKey(text_sha256(text), "TOXICITY", "en", "v1alpha1")
        rows.append(dict(zip(COLUMNS, (*key, "ok", json.dumps(body), None, "2026-01-01T00:00:00"))))
    return pa.Table.from_pylist(rows, CACHE_ANSWER_SCHEMA)


def test_a_start_reads_only_keys_and_a_lookup_only_the_shards_it_needs(
    s3: CountingMotoServer, tmp_path: Path
) -> None:
    """Python's and Arrow's peak allocations while a node starts (`CacheMirror`: the shards'
    key column, an index of 12 B an answer) and then looks every stored text up in chunks
    (`fill`: each shard read once, when a chunk needs it): the same for 4 shards as for 16,
    since no answer is held in memory (allocation counts, not timing: the same on any
    machine)."""
    peaks = []
    for shards in (1, 4, 16):  # the first one warms up (imports, caches)
        uri = s3.uri("runs", f"load-{shards}")
        for n in range(shards):
            RunStore(uri).write_table(
                f"cache/perspective-scores/part-c-{n:03d}.parquet",
                answer_table(500 * n, 500 * (n + 1)),
            )
        pool = pa.proxy_memory_pool(pa.default_memory_pool())
        before = pa.default_memory_pool()
        pa.set_memory_pool(pool)
        tracemalloc.start()
        try:
            mirror = CacheMirror(uri, FILE)
            started = mirror.stats["loaded"]
            _, start_peak = tracemalloc.get_traced_memory()
            for n in range(shards):
                keys = [key_of(t) for t in texts(500 * n, 500 * (n + 1))]
                assert len(mirror.fill(keys)) == 500 and mirror.read == set(range(n + 1))
            _, python_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            pa.set_memory_pool(before)
        assert started == 0 and mirror.stats["loaded"] == 500 * shards
        mirror.close()
        peaks.append((start_peak, python_peak, pool.max_memory()))
    (start4, py4, arrow4), (start16, py16, arrow16) = peaks[1:]
    # held whole, the 6,000 more answers would take ~4 MB of Python strings; the index
    # takes 72 KB more
    assert start16 - start4 < 500_000 and py16 - py4 < 1_000_000, peaks
    assert arrow16 <= arrow4 + 64_000, peaks


def key_of(text: str) -> CacheKey:
    return CacheKey(text_sha256(text), "TOXICITY", "en", "v1alpha1")


def test_a_killed_actors_working_copy_is_removed_by_the_next_start(
    s3: CountingMotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed actor leaves its temp folder (~481 B an answer); the next mirror started on
    the node removes those of processes that are gone, never a live process's."""
    import subprocess
    import sys
    import tempfile

    from workers.scorers.cache_mirror import TEMP_PREFIX

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f"{TEMP_PREFIX}{gone.stdout.strip()}-abc"
    live = tmp_path / f"{TEMP_PREFIX}{os.getppid()}-def"  # this test's parent: alive
    other = tmp_path / "lidao-cache-notes"  # not a working copy's name
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / FILE).write_bytes(b"x" * 481)
    mirror = CacheMirror(s3.uri("runs", "stale"), FILE)
    assert not stale.exists() and live.exists() and other.exists()
    assert Path(mirror.dir).parent == tmp_path and Path(mirror.dir).is_dir()
    mirror.close()
    assert not Path(mirror.dir).exists()


def test_old_whole_file_caches_and_shards_in_a_local_run_are_read(
    s3: CountingMotoServer, fake: FakePerspective, tmp_path: Path
) -> None:
    old = ScoreCache(str(tmp_path / FILE))  # what versions before the shards put back
    (text,) = texts(0, 1)
    key = CacheKey(text_sha256(text), "TOXICITY", "en", "v1alpha1")
    old.put_many([(key, "ok", response(text, ["TOXICITY"], 0.125), None)])
    old.close()
    uri = s3.uri("runs", "legacy")
    RunStore(uri).write_bytes(f"cache/{FILE}", (tmp_path / FILE).read_bytes())
    out, stats = stage(uri, fake, [text])
    assert out[0]["toxicity"] == 0.125 and not fake.calls and stats["put_answers"] == 0

    local = RunStore(str(tmp_path / "run"))  # a run copied down from S3 keeps its shards
    local.write_table("cache/perspective-scores/part-c-0.parquet", answer_table(5, 7))
    mirror = CacheMirror(local.uri, FILE)
    assert mirror.dir == local.path("cache") and mirror.stats["loaded"] == 2
    assert ScoreCache(str(tmp_path / "run" / "cache" / FILE)).count_after(0) == 2
    assert mirror.close() == {"loaded": 2, "put_answers": 0, "put_shards": 0}

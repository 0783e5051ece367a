"""Storage faults on S3 (a moto server on 127.0.0.1 that fails requests on cue) and on disk:
transient read errors are retried, only shards damaged as stored are quarantined, a shard is
one request, temp files of a killed writer are cleaned, score shards are compacted."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from results.run import reader as quarantine
from results.run import shards
from results.run.store import RunStore, StoreError
from results.schema import score_schema
from results.stats.join import latest_version
from tests.fake_run import generation_row

pytest.importorskip("moto.server")
from tests.aws_env import aws_test_env  # noqa: E402
from tests.s3_server import CountingMotoServer  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[CountingMotoServer]:
    with aws_test_env():
        srv = CountingMotoServer()
        srv.start()
        try:
            srv.create_bucket("runs")
            yield srv
        finally:
            srv.stop()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two SDK attempts per request and short project-level waits: faults outlast the SDK."""
    monkeypatch.setattr(shards, "S3_MAX_ATTEMPTS", 2)
    monkeypatch.setattr(shards, "RETRY_BACKOFF_S", 0.01)


def three_shards(store: RunStore) -> list[str]:
    return [
        store.write_generations([generation_row(f"j{i:03d}") for i in range(k, k + 2)])
        for k in (0, 2, 4)
    ]


ALL = {f"j{i:03d}" for i in range(6)}


def test_a_shard_is_one_request_and_the_resume_check_needs_no_request_per_shard(
    server: CountingMotoServer,
) -> None:
    store = RunStore(server.uri("runs", "count"))
    server.reset()
    three_shards(store)
    assert dict(server.requests) == {"PUT put": 3}  # no multipart create / part / complete
    server.reset()
    assert RunStore(store.uri).done_job_ids() == ALL
    assert server.requests["HEAD head"] == 0  # sizes come from the one listing
    assert server.requests["GET list"] == 1


def test_a_transient_read_error_during_resume_is_retried(
    server: CountingMotoServer, quick_retries: None
) -> None:
    store = RunStore(server.uri("runs", "transient"))
    three_shards(store)
    # one failed GET: the SDK's own retry absorbs it
    server.reset()
    server.fail("GET /runs/transient/generations/part-", times=1)
    assert RunStore(store.uri).done_job_ids() == ALL
    assert server.requests["GET get"] >= 4  # 3 shards + the failed attempt
    # more failures than the SDK tries per request: the project-level retry reads again
    server.fail("GET /runs/transient/generations/part-", times=4)
    again = RunStore(store.uri)
    assert again.done_job_ids() == ALL
    assert again.reader.retries >= 1
    assert again.quarantine_files() == [] and len(again.list_shards("generations")) == 3


def test_the_plan_is_read_again_after_a_transient_error(
    server: CountingMotoServer, quick_retries: None
) -> None:
    from tests.helpers import make_jobs

    store = RunStore(server.uri("runs", "plan"))
    jobs = make_jobs(n=6)
    store.write_plan_jobs([jobs[:3], jobs[3:]])  # two row groups
    server.fail("GET /runs/plan/plan.parquet", times=5)  # more than the SDK's 2 tries
    again = RunStore(store.uri)
    ids = [i for t in again.iter_plan(["job_id"]) for i in t["job_id"].to_pylist()]
    assert ids == [j.job_id for j in jobs]
    server.fail("GET /runs/plan/plan.parquet", times=4)
    assert again.read_plan()["job_id"].to_list() == ids


def test_a_read_error_that_outlasts_every_retry_quarantines_nothing(
    server: CountingMotoServer, quick_retries: None
) -> None:
    store = RunStore(server.uri("runs", "persistent"))
    paths = three_shards(store)
    key = paths[1].split("/", 1)[1]  # without the bucket
    server.fail(f"GET /runs/{key}", times=10_000)
    try:
        with pytest.raises(StoreError, match="no shard is damaged as stored"):
            RunStore(store.uri).done_job_ids()
    finally:
        server.reset()
    fresh = RunStore(store.uri)
    assert fresh.quarantine_files() == []
    assert fresh.list_shards("generations") == sorted(paths)
    assert fresh.done_job_ids() == ALL


def test_a_torn_object_is_quarantined_and_a_flaky_healthy_one_is_not(
    server: CountingMotoServer, quick_retries: None
) -> None:
    store = RunStore(server.uri("runs", "torn"))
    paths = three_shards(store)
    with store.fs.open_input_stream(paths[0]) as fh:
        whole = fh.read()
    with store.fs.open_output_stream(paths[0]) as out:  # torn: the footer is gone
        out.write(whole[: len(whole) // 2])
    server.fail("GET /runs/" + paths[2].split("/", 1)[1], times=3)  # healthy but flaky
    again = RunStore(store.uri)
    assert again.done_job_ids() == ALL - {"j000", "j001"}
    assert [p.rsplit("/", 1)[1] for p in again.quarantine_files()] == [paths[0].rsplit("/", 1)[1]]
    assert sorted(again.list_shards("generations")) == sorted(paths[1:])


def test_a_shard_is_quarantined_only_when_the_whole_object_was_fetched(tmp_path: Path) -> None:
    """The probe: a fetch that fails or comes back short is not damage."""
    store = RunStore(str(tmp_path))
    paths = three_shards(store)
    with open(paths[0], "r+b") as fh:
        fh.truncate(os.path.getsize(paths[0]) // 2)
    reader = store.reader
    reader.listing(("generations",))
    assert list(reader._damaged(paths)) == [paths[0]]  # the truncated one, fetched whole

    # On a connection where paths[1] (healthy) comes back short and paths[2] fails to fetch,
    # neither is damage: only bytes as many as listed that do not parse are; paths[0] still is.
    class Transport:
        local = pafs.LocalFileSystem()

        def get_file_info(self, wanted: list[str]) -> list[Any]:
            return list(self.local.get_file_info(wanted))

        def open_input_stream(self, path: str) -> Any:
            if path == paths[2]:
                raise OSError("connection reset by peer")
            if path == paths[1]:
                with open(path, "rb") as fh:
                    return pa.BufferReader(fh.read()[:100])  # the connection dropped
            return self.local.open_input_stream(path)

    assert list(quarantine.damaged(Transport, paths, "run", 2)) == [paths[0]]


def test_temp_files_of_a_killed_plan_writer_are_removed_by_the_next_run(
    server: CountingMotoServer, tmp_path: Path
) -> None:
    from tests.helpers import make_jobs

    for uri in (str(tmp_path / "run"), server.uri("runs", "tmpplan")):
        store = RunStore(uri)
        store.write_plan_jobs([make_jobs(n=2)])
        # a kill between closing the temp object and copying it into place leaves this
        store.write_bytes(".tmp-0123456789ab-plan.parquet", b"half a plan")
        store.write_bytes("generations/part-keep.parquet", b"not ours to judge")
        store.write_plan_jobs([make_jobs(n=3)])
        sel = pafs.FileSelector(store.root, recursive=True)
        names = sorted(i.base_name for i in store.fs.get_file_info(sel) if i.size is not None)
        assert ".tmp-0123456789ab-plan.parquet" not in names, uri
        assert "part-keep.parquet" in names and "plan.parquet" in names
        assert store.read_plan().height == 3


# ---- score shards: compacted, versions kept apart, the newest version stays the newest ---------
def score_rows(ids: range, version: str) -> list[dict[str, object]]:
    return [
        {
            "job_id": f"j{i:03d}",
            "scorer": "sentiment-vader",
            "scorer_version": version,
            "metric": "sentiment",
            "status": "ok",
            "error": None,
            "sentiment": float(i) if version == "new" else -1.0,
        }
        for i in ids
    ]


def test_score_compaction_keeps_each_version_apart_and_the_newest_newest(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    new = [
        store.write_scores("sentiment-vader", "sentiment", score_rows(range(k, k + 3), "new"))
        for k in (0, 3, 6)
    ]
    old = [
        store.write_scores("sentiment-vader", "sentiment", score_rows(range(k, k + 5), "old"))
        for k in (0, 5)
    ]
    for path in old:  # the old version was written first
        os.utime(path, (1_000_000_000, 1_000_000_000))
    for path in new:
        os.utime(path, (1_500_000_000, 1_500_000_000))
    # a chunk rescored (the same ids and version, e.g. a retried chunk of another size)
    again = store.write_scores("sentiment-vader", "sentiment", score_rows(range(2, 4), "new"))
    os.utime(again, (1_600_000_000, 1_600_000_000))
    before = store.read_scores("sentiment-vader", "sentiment")
    assert latest_version(store, "sentiment-vader") == ("new", ("old",))

    merged = store.compact_scores("sentiment-vader", "sentiment", target_rows=6)
    assert merged == 6
    after = RunStore(str(tmp_path))
    shards_now = after.list_shards("scores", "sentiment-vader")
    assert all(p.rsplit("/", 1)[1].startswith("part-c-") for p in shards_now)
    assert len(shards_now) == 3  # new: 3+3 rows, then 3+2; old: 5+5 rows
    got = after.read_scores("sentiment-vader", "sentiment")
    key = ["scorer_version", "job_id"]
    assert got.sort(key).equals(before.sort(key))  # every (job, version) once, same values
    assert after.score_versions("sentiment-vader") == {
        "old": 1_000_000_000.0,
        "new": 1_600_000_000.0,
    }
    assert latest_version(after, "sentiment-vader") == ("new", ("old",))
    assert after.compact_scores("sentiment-vader", "sentiment") == 0  # nothing left to merge


def test_a_score_compaction_killed_before_deleting_counts_nothing_twice(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    for k in (0, 4):
        store.write_scores("sentiment-vader", "sentiment", score_rows(range(k, k + 4), "new"))
    chunks = store.reader.listing(("scores", "sentiment-vader"))
    # what a compaction killed before its deletes leaves: the new shard beside its inputs
    written: list[str] = []
    store._compact_scores("sentiment-vader", score_schema("sentiment"), chunks, 100, written)
    assert len(written) == 1 and len(store.list_shards("scores", "sentiment-vader")) == 3
    frame = RunStore(str(tmp_path)).read_scores("sentiment-vader", "sentiment")
    assert sorted(frame["job_id"]) == [f"j{i:03d}" for i in range(8)]
    assert json.loads(pq.read_metadata(written[0]).metadata[b"lidao_versions"]).keys() == {"new"}
    assert store.compact_scores("sentiment-vader", "sentiment") == len(chunks)
    assert store.list_shards("scores", "sentiment-vader") == written

"""Run directory: atomic shards, dedup on read, schema version guard."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from harness.stages.generation.stage import failed_row
from jobs.spec import JobSpec
from results.run.store import DoneIds, RunStore, StoreError
from tests.aws_env import aws_test_env
from tests.helpers import make_jobs


def ok_row(job, text: str = "hello"):  # type: ignore[no-untyped-def]
    row = failed_row(job, "x")
    row.update(status="ok", error=None, continuation=text, num_tokens=1, finish_reason="length")
    return row


def test_shards_are_written_whole_and_named_by_their_jobs(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    jobs = make_jobs(n=4)
    a = store.write_generations([ok_row(j) for j in jobs[:2]])
    b = store.write_generations([ok_row(j) for j in reversed(jobs[:2])])
    assert a == b  # a retried batch rewrites the same file
    store.write_generations([ok_row(j) for j in jobs[2:]])
    assert store.done_job_ids() == {j.job_id for j in jobs}
    assert not [f for f in os.listdir(tmp_path / "generations") if f.startswith(".tmp")]


def test_a_failed_write_leaves_no_partial_shard(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    rows = [ok_row(j) for j in make_jobs(n=2)]
    rows[1]["num_tokens"] = "not an int"  # the table cannot be built: nothing may land
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, TypeError)):
        store.write_generations(rows)
    assert store.list_shards("generations") == []


def test_an_ok_row_wins_over_an_error_row_of_the_same_job(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    job = make_jobs(n=1)[0]
    store.write_generations([failed_row(job, "boom")])
    store.write_table(
        "generations/part-zz.parquet",
        pa.Table.from_pylist([ok_row(job)], store.read_generations().to_arrow().schema),
    )
    frame = store.read_generations()
    assert frame.height == 1 and frame["status"][0] == "ok"


def test_a_newer_schema_version_is_a_clear_error(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    store.write_generations([ok_row(j) for j in make_jobs(n=1)])
    path = store.list_shards("generations")[0]
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({b"lidao_schema_version": b"99"}), path)
    with pytest.raises(StoreError, match="schema version 99"):
        store.read_generations()


def test_shards_of_an_older_schema_read_with_missing_columns_as_null(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    row = ok_row(make_jobs(n=1)[0])
    old = {k: v for k, v in row.items() if k not in ("choices", "loss_g", "elidao_gender")}
    os.makedirs(tmp_path / "generations")
    pq.write_table(pa.Table.from_pylist([old]), tmp_path / "generations" / "part-old.parquet")
    frame = store.read_generations()
    assert frame.height == 1 and frame["choices"][0] is None and frame["continuation"][0] == "hello"


# ---- scale: quarantine, aborted uploads, compaction, cache, modes ---------------------------


@pytest.fixture(scope="module")
def s3_uri() -> Iterator[str]:
    """A bucket on a local S3 stand-in (moto on 127.0.0.1), as a pyarrow URI prefix."""
    moto_server = pytest.importorskip("moto.server")
    import boto3

    with aws_test_env():
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        server.start()
        try:
            host, port = server.get_host_and_port()
            boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket="runs")
            yield f"s3://runs/{{}}?endpoint_override={host}:{port}&scheme=http"
        finally:
            server.stop()


def shards_of_two(store: RunStore, jobs: list[JobSpec]) -> list[str]:
    return [store.write_generations([ok_row(j) for j in jobs[i : i + 2]]) for i in (0, 2, 4)]


def three_shards(tmp_path: Path) -> tuple[RunStore, list[JobSpec], list[str]]:
    """A run directory of six ok jobs, two a shard: (store, jobs, the shards' paths)."""
    store = RunStore(str(tmp_path))
    jobs = make_jobs(n=6)
    return store, jobs, shards_of_two(store, jobs)


def test_an_unreadable_shard_is_quarantined_and_its_jobs_are_pending_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, jobs, paths = three_shards(tmp_path)
    with open(paths[1], "r+b") as fh:  # a torn shard: its footer is gone
        fh.truncate(os.path.getsize(paths[1]) // 2)
    with caplog.at_level(logging.WARNING, logger="harness"):
        done = store.done_job_ids()
    assert done == {j.job_id for j in jobs[:2] + jobs[4:]}  # lost nothing readable
    name = os.path.basename(paths[1])
    moved = tmp_path / "quarantine" / "generations" / name
    assert moved.exists() and not os.path.exists(paths[1])
    assert name in caplog.text and "<Buffer>" not in caplog.text
    assert store.quarantine_files() == [str(moved)]
    # the jobs come back: a re-run writes them once, and every job counts once
    store.write_generations([ok_row(j) for j in jobs[2:4]])
    frame = RunStore(str(tmp_path)).read_generations()
    assert sorted(frame["job_id"]) == sorted(j.job_id for j in jobs)


def test_an_unreadable_plan_is_an_error_naming_the_file(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    store.write_plan_jobs([make_jobs(n=2)])
    (tmp_path / "plan.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(StoreError, match=r"plan\.parquet") as err:
        store.read_plan()
    assert "<Buffer>" not in str(err.value)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_exception_inside_a_streamed_write_publishes_nothing(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    uri = (
        str(tmp_path / "run")
        if where == "local"
        else request.getfixturevalue("s3_uri").format("abort")
    )
    store = RunStore(uri)
    jobs = make_jobs(n=6)

    def chunks_then_crash() -> Iterator[list[JobSpec]]:
        yield jobs[:3]
        raise RuntimeError("planner crashed half-way")

    with pytest.raises(RuntimeError, match="half-way"):
        store.write_plan_jobs(chunks_then_crash())
    with pytest.raises(RuntimeError, match="inside"), store.open_atomic("plan.parquet") as out:
        out.write(b"x" * 1000)
        raise RuntimeError("inside the stream")
    assert not store.exists("plan.parquet")
    sel = pafs.FileSelector(store.root, allow_not_found=True, recursive=True)
    assert [i.path for i in store.fs.get_file_info(sel) if i.type == pafs.FileType.File] == []
    assert store.write_plan_jobs([jobs[:4], jobs[4:]]) == 6  # a clean retry: every job once
    assert store.read_plan()["job_id"].to_list() == [j.job_id for j in jobs]


def test_compaction_merges_shards_and_a_kill_half_way_counts_nothing_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, jobs, _ = three_shards(tmp_path)
    store.write_generations([failed_row(jobs[0], "boom")], kind="failed")  # ok wins over it
    real_delete = store.delete
    deleted: list[str] = []

    class Killed(BaseException):
        pass

    def die_after_one(path: str) -> None:
        if deleted:
            raise Killed  # SIGKILL between the new shard and the removal of the old ones
        deleted.append(path)
        real_delete(path)

    monkeypatch.setattr(store, "delete", die_after_one)
    with pytest.raises(Killed):
        store.compact_generations(target_rows=4)
    monkeypatch.undo()
    again = RunStore(str(tmp_path))
    frame = again.read_generations()
    assert sorted(frame["job_id"]) == sorted(j.job_id for j in jobs)  # each job once
    assert (frame["status"] == "ok").all()
    assert again.compact_generations(target_rows=4) > 0
    names = [os.path.basename(p) for p in again.list_shards("generations")]
    assert names and all(n.startswith("part-c-") for n in names)
    assert again.read_generations().sort("job_id").equals(frame.sort("job_id"))


def test_compaction_streams_groups_and_keeps_one_row_per_job_across_them(tmp_path: Path) -> None:
    """Groups of `target_rows` are compacted one at a time (bounded memory): an error row in
    one group loses to its job's ok row in another, and an unreadable input is quarantined."""
    store = RunStore(str(tmp_path))
    jobs = make_jobs(n=40)
    paths = [store.write_generations([ok_row(j) for j in jobs[i : i + 2]]) for i in range(0, 40, 2)]
    store.write_generations([failed_row(jobs[39], "boom")], kind="failed")  # ok row elsewhere
    store.write_generations([failed_row(j, "boom") for j in jobs[:2]], kind="failed")
    lone = make_jobs(n=42)[40:]  # failed, with no ok row anywhere: their error rows stay
    store.write_generations([failed_row(j, "boom") for j in lone], kind="failed")
    Path(paths[3]).write_bytes(b"torn")  # jobs 6 and 7: unreadable
    assert store.compact_generations(target_rows=6) == 22  # 23 inputs less the torn one
    names = [os.path.basename(p) for p in store.list_shards("generations")]
    assert len(names) >= 3 and all(n.startswith("part-c-") for n in names)
    on_disk = store.reader.count_rows(("generations",), store_schema())
    assert on_disk == 40  # every readable job once: no error row beside its ok row
    frame = store.read_generations(["job_id", "status"])
    kept = [j for j in jobs if j not in jobs[6:8]] + lone
    assert sorted(frame["job_id"]) == sorted(j.job_id for j in kept)
    errors = frame.filter(frame["status"] != "ok")["job_id"].to_list()
    assert sorted(errors) == sorted(j.job_id for j in lone)
    assert [os.path.basename(p) for p in store.quarantine_files()] == [os.path.basename(paths[3])]

    # No job with both kinds of rows: every error row stays as it is.
    other = RunStore(str(tmp_path / "other"))
    other.write_generations([ok_row(j) for j in jobs[:2]])
    other.write_generations([failed_row(j, "boom") for j in lone], kind="failed")
    assert other.compact_generations(target_rows=6) == 2
    statuses = other.read_generations(["status"])["status"].to_list()
    assert sorted(statuses) == ["error", "error", "ok", "ok"]


def store_schema() -> pa.Schema:
    from results.schema import GENERATION_SCHEMA

    return GENERATION_SCHEMA


def test_reads_are_cached_until_the_folder_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(str(tmp_path))
    jobs = make_jobs(n=6)
    shards_of_two(store, jobs[:4])
    scans: list[list[str] | None] = []
    real = store.reader._scan_paths

    def counting(paths: list[str], schema: pa.Schema, cols: list[str] | None) -> pa.Table:
        scans.append(cols)
        return real(paths, schema, cols)

    monkeypatch.setattr(store.reader, "_scan_paths", counting)
    store.read_generations()
    assert store.read_generations(["job_id", "status"]).height == 4
    assert store.read_generations(["job_id"]).height == 4
    assert len(scans) == 1  # one scan serves the later, narrower reads
    store.write_generations([ok_row(j) for j in jobs[4:]])
    assert store.read_generations(["job_id", "status"]).height == 6 and len(scans) == 2
    assert scans[1] == ["job_id", "status"]  # only the columns asked for


def test_the_resume_check_streams_two_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, jobs, _ = three_shards(tmp_path)
    store.write_generations([failed_row(jobs[0], "boom")], kind="failed")
    store.write_generations([failed_row(jobs[5], "boom")], kind="failed")
    read: list[list[str]] = []
    real = store.reader.iter_batches

    def recording(parts: Any, schema: pa.Schema, columns: list[str], rows: int) -> Any:
        read.append(columns)
        return real(parts, schema, columns, rows)

    monkeypatch.setattr(store.reader, "iter_batches", recording)
    ok, failed = store.finished_ids()
    assert len(ok) == 6 and len(failed) == 0  # an ok row wins over an error row
    assert read == [["job_id", "status"]]


def test_files_follow_the_umask(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    old = os.umask(0o027)
    try:
        shard = store.write_generations([ok_row(j) for j in make_jobs(n=1)])
        store.write_plan_jobs([make_jobs(n=1)])
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(shard).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "plan.parquet").st_mode) == 0o640
    os.umask(0o022)
    try:
        manifest = store.write_json("manifest.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o644


def test_done_ids_answer_membership_like_a_set() -> None:
    ids = [f"j1-{i:020x}" for i in range(0, 1000, 3)]
    done = DoneIds.from_arrow(pa.chunked_array([ids[:100], ids[100:] + ids[:5]]))
    probe = [f"j1-{i:020x}" for i in range(1000)] + ["j1-", "j1-" + "0" * 30, "x"]
    assert list(done.contains(probe)) == [p in set(ids) for p in probe]
    assert len(done) == len(ids) and sorted(done.to_list()) == sorted(ids)
    mixed = DoneIds.from_arrow(pa.array(["a", "bbb"]))
    assert list(mixed.contains(["a", "bb", "bbb", "bbbb"])) == [True, False, True, False]
    assert not DoneIds.from_arrow(pa.array([], pa.string())).contains(["a"]).any()


def test_status_counts_each_job_once_and_lists_quarantined_shards(tmp_path: Path) -> None:
    from harness.cli.status import run_status

    store = RunStore(str(tmp_path))
    jobs = make_jobs(n=6)
    store.write_plan_jobs([jobs[:4], jobs[4:]])
    store.write_generations([ok_row(j) for j in jobs[:2]])
    store.write_generations([failed_row(jobs[2], "boom")], kind="failed")
    store.write_generations([ok_row(jobs[0])], kind="retry")  # the same job twice: counted once
    torn = store.write_generations([ok_row(j) for j in jobs[3:5]])
    with open(torn, "r+b") as fh:
        fh.truncate(10)
    text = run_status(RunStore(str(tmp_path)))
    assert "planned 6, done 2, failed 1, pending 3" in text
    assert os.path.basename(torn) in text and "quarantined" in text


def test_heads_are_written_with_the_umasks_mode_not_mkstemps(tmp_path: Path) -> None:
    from workers.methods.heads import AttributeHead, save_head

    old = os.umask(0o022)
    try:
        paths = save_head(AttributeHead(8, ["neg", "pos"], 1, {}), str(tmp_path / "head"))
    finally:
        os.umask(old)
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in paths] == [0o644, 0o644]

"""Run directory: atomic shards, dedup on read, schema version guard."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.generation import failed_row
from results.store import RunStore, StoreError
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

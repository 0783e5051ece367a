"""Score rows held by their writer (`ScoreBuffer`) and written ~8k at a time: nothing held is
counted as scored, and the chunks of an actor that dies holding rows are scored again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.stages.scoring.loop import ScoreLoop
from harness.stages.scoring.pool import PoolSettings
from harness.stages.scoring.stage import score_run
from results.run.store import RunStore
from tests.fake_run import generation_row
from workers.scorers.base import ScorerContext
from workers.scorers.score_buffer import ScoreBuffer, ScoringError

IDS = [f"j{i:03d}" for i in range(8)]


def make_run(root: Path) -> RunStore:
    store = RunStore(str(root))
    store.write_generations([generation_row(i, continuation=" he said no.") for i in IDS])
    return store


def rows(ids: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "job_id": i,
            "scorer": "gender",
            "scorer_version": "v",
            "metric": "gender",
            "status": "ok",
            "error": None,
            "label_x": "none",
            "label_cx": "none",
            "label_c": "none",
        }
        for i in ids
    ]


def test_the_buffer_writes_one_shard_per_flush_and_checks_every_chunk(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    buf = ScoreBuffer(store, "gender", flush_rows=5)
    chunks = [[{"job_id": i} for i in IDS[k : k + 2]] for k in range(0, 8, 2)]
    flushed = [buf.add(chunk, rows([r["job_id"] for r in chunk])) for chunk in chunks]
    assert flushed == [False, False, True, False]  # 6 rows ≥ 5: one shard
    assert len(store.list_shards("scores", "gender")) == 1
    with pytest.raises(ScoringError, match="returned 1 rows for 2"):
        buf.add(chunks[0], rows(["j000"]))  # a row lost by the scorer is never held
    assert buf.flush() == 2 and buf.flush() == 0
    assert sorted(store.read_scores("gender", "gender")["job_id"]) == IDS


def test_a_failed_write_keeps_the_rows_held_and_fails_only_the_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(str(tmp_path))
    buf = ScoreBuffer(store, "gender", flush_rows=3)
    assert not buf.add([{"job_id": "j000"}, {"job_id": "j001"}], rows(["j000", "j001"]))
    real = store.write_scores

    def full_disk(*args: Any) -> str:
        raise OSError("no space left on device")

    monkeypatch.setattr(store, "write_scores", full_disk)
    with pytest.raises(OSError, match="no space"):
        buf.add([{"job_id": "j002"}, {"job_id": "j003"}], rows(["j002", "j003"]))
    assert [r["job_id"] for r in buf.rows] == ["j000", "j001"]  # the failed chunk is retried
    monkeypatch.setattr(store, "write_scores", real)
    assert buf.add([{"job_id": "j002"}, {"job_id": "j003"}], rows(["j002", "j003"]))
    assert sorted(store.read_scores("gender", "gender")["job_id"]) == IDS[:4]


def test_an_actor_that_dies_holding_rows_has_its_chunks_scored_again(
    ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    store = make_run(tmp_path / "run")
    flush_all = ScoreLoop._flush_all
    killed: list[Any] = []

    def die_before_the_flush(loop: ScoreLoop) -> bool:
        if not killed:  # every chunk is scored and held, none written
            assert store.list_shards("scores", "gender") == []
            for pool in loop.pools:
                for actor in pool.actors:
                    killed.append(actor.handle)
                    ray.kill(actor.handle, no_restart=True)
        return flush_all(loop)

    monkeypatch.setattr(ScoreLoop, "_flush_all", die_before_the_flush)
    stats = score_run(
        store,
        [("gender", {})],
        ScorerContext(),
        use_ray=True,
        batch_size=2,
        progress=False,
        pools=PoolSettings(flush_rows=100),
    )["gender"]
    assert killed
    frame = RunStore(store.uri).read_scores("gender", "gender")
    assert sorted(frame["job_id"]) == IDS  # every job once
    assert stats["scored"] == 8  # counted when written, not when held
    ends = [a["end"] for a in stats["actors"]]
    assert ends[0].startswith("flush failed") and ends[-1] == "released"

"""`results.run.overwrite`: the staged overwrite of a scorer's scores, and the recovery of old
scores that a crash between its two moves left aside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from results.run.overwrite import STAGING, StagedScores, score_overwriting
from results.run.store import RunStore


def score_rows(ids: range, value: float) -> list[dict[str, Any]]:
    return [
        dict(job_id=f"j{i:03d}", scorer="sentiment-vader", scorer_version="v1",
             metric="sentiment", status="ok", error=None, sentiment=value)
        for i in ids
    ]  # fmt: skip


def sentiments(store: RunStore) -> list[float]:
    return store.read_scores("sentiment-vader", "sentiment").sort("job_id")["sentiment"].to_list()


def test_staged_scores_are_swapped_in_only_when_scoring_succeeds(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_scores("sentiment-vader", "sentiment", score_rows(range(3), 0.5))

    def fails(staged: RunStore) -> dict[str, Any]:
        staged.write_scores("sentiment-vader", "sentiment", score_rows(range(2), 0.25))
        assert isinstance(staged, StagedScores) and sentiments(staged) == [0.25, 0.25]
        raise RuntimeError("scorer broke")

    with pytest.raises(RuntimeError, match="scorer broke"):
        score_overwriting(store, ["sentiment-vader"], fails)
    assert sentiments(store) == [0.5, 0.5, 0.5]  # untouched

    def works(staged: RunStore) -> dict[str, Any]:
        assert staged.read_scores("sentiment-vader", "sentiment").is_empty()  # a fresh start
        staged.write_scores("sentiment-vader", "sentiment", score_rows(range(3), 0.25))
        return {"sentiment-vader": {}}

    assert score_overwriting(store, ["sentiment-vader"], works) == {"sentiment-vader": {}}
    assert sentiments(store) == [0.25, 0.25, 0.25]
    assert not (tmp_path / "run" / STAGING).exists()


def test_old_scores_left_aside_by_a_crash_are_recovered_first(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.write_scores("sentiment-vader", "sentiment", score_rows(range(3), 0.5))
    aside = tmp_path / "run" / STAGING / "sentiment-vader.old"
    aside.parent.mkdir()
    (tmp_path / "run" / "scores" / "sentiment-vader").rename(aside)  # the crash's state

    def fails(staged: RunStore) -> dict[str, Any]:
        raise RuntimeError("scorer broke")

    with pytest.raises(RuntimeError):
        score_overwriting(store, ["sentiment-vader"], fails)
    assert sentiments(RunStore(store.uri)) == [0.5, 0.5, 0.5]  # back in scores/, not deleted
    assert not aside.exists()

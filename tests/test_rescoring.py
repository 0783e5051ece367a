"""The scoring stage (`harness.stages.scoring.stage.score_run`): only what is missing, per scorer version."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fake_run import generation_row

from harness.stages.scoring.stage import ScoringError, score_run
from jobs.words import GroupWords
from results.run.store import RunStore, StoreError
from results.schema import GENERATION_SCHEMA
from workers.scorers.base import ScorerContext

CTX = ScorerContext(device="cpu")
CONTINUATIONS = [
    " was a great doctor .",
    " is a bad man",
    "",
    " she was kind and happy",
    " he said no",
    " the nurse",
]


def make_run(root: Path, n: int = 6, errors: int = 1) -> RunStore:
    """A run with `n` ok generations (one with an empty continuation) and `errors` failed ones."""
    store = RunStore(str(root))
    rows = [
        generation_row(f"j{i:03d}", continuation=CONTINUATIONS[i % len(CONTINUATIONS)])
        for i in range(n)
    ]
    rows += [
        generation_row(f"x{i:03d}", status="error", continuation=None, error="boom")
        for i in range(errors)
    ]
    store.write_generations(rows[: n // 2])
    store.write_generations(rows[n // 2 :])
    return store


def test_score_adds_a_scorer_to_a_run_made_before_it_existed(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    first = score_run(store, [("gender", {})], CTX, use_ray=False, progress=False)
    assert first["gender"]["scored"] == 6 and store.scorers() == ["gender"]
    both = score_run(
        store, [("gender", {}), ("sentiment-vader", {})], CTX, use_ray=False, batch_size=4
    )
    assert both["gender"]["scored"] == 0 and both["gender"]["skipped"] == 6
    assert both["sentiment-vader"]["scored"] == 6 and both["sentiment-vader"]["status"] == {
        "ok": 5,
        "empty": 1,
    }
    vader = store.read_scores("sentiment-vader", "sentiment")
    assert sorted(vader["job_id"]) == [
        f"j{i:03d}" for i in range(6)
    ]  # error generations are not scored
    # chunks of 4 rows, held by their writer and written as one shard (`ScoreBuffer`)
    assert len(store.list_shards("scores", "sentiment-vader")) == 1


def test_rerunning_does_no_work(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    scorers = [("gender", {}), ("perplexity", {"model": "tiny-random/gpt2"})]
    score_run(store, scorers, CTX, use_ray=False, progress=False)
    shards = sorted(p.name for p in (tmp_path / "run" / "scores").rglob("part-*.parquet"))
    again = score_run(store, scorers, CTX, use_ray=False, progress=False)
    assert {name: s["scored"] for name, s in again.items()} == {"gender": 0, "perplexity": 0}
    assert sorted(p.name for p in (tmp_path / "run" / "scores").rglob("part-*.parquet")) == shards


def test_new_generations_are_scored_and_old_ones_are_not(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    score_run(store, [("sentiment-vader", {})], CTX, use_ray=False, progress=False)
    store.write_generations([generation_row("j100", continuation=" a new one")])
    stats = score_run(store, [("sentiment-vader", {})], CTX, use_ray=False, progress=False)
    assert stats["sentiment-vader"]["scored"] == 1 and stats["sentiment-vader"]["skipped"] == 6


def test_a_changed_scorer_version_rescores_and_keeps_the_old_rows(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    old = score_run(store, [("sentiment-vader", {})], CTX, use_ray=False, progress=False)
    params = {"text_field": "prompt+continuation"}  # part of the version: scores change
    new = score_run(store, [("sentiment-vader", params)], CTX, use_ray=False, progress=False)
    assert (
        new["sentiment-vader"]["scored"] == 6
        and new["sentiment-vader"]["version"] != old["sentiment-vader"]["version"]
    )
    scores = store.read_scores("sentiment-vader", "sentiment")
    assert scores.group_by("scorer_version").len()["len"].to_list() == [6, 6]
    # the gender scorer's version follows the seed words of the context
    score_run(store, [("gender", {})], CTX, use_ray=False, progress=False)
    words = GroupWords(("female", "male"), {"female": ("she",), "male": ("he",)}, (("she", "he"),))
    again = score_run(
        store, [("gender", {})], ScorerContext(words=words), use_ray=False, progress=False
    )
    assert again["gender"]["scored"] == 6


def test_scoring_a_run_without_generations_is_an_error(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path / "run"))
    store.makedirs()
    with pytest.raises(
        StoreError, match=r"no generations in .*run; run `python -m harness run` first"
    ):
        score_run(store, [("gender", {})], CTX, use_ray=False)
    assert (
        not (tmp_path / "run" / "scores").exists()
        and not (tmp_path / "run" / "generations").exists()
    )


def test_generations_from_a_newer_schema_are_refused(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    table = pa.Table.from_pylist([generation_row("j999")], GENERATION_SCHEMA)
    table = table.replace_schema_metadata({b"lidao_schema_version": b"99"})
    pq.write_table(table, tmp_path / "run" / "generations" / "part-zzz.parquet")
    with pytest.raises(StoreError, match="schema version 99"):
        score_run(store, [("gender", {})], CTX, use_ray=False)


def test_unknown_scorer_or_parameter_fails_before_any_work(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    with pytest.raises(KeyError, match="did you mean sentiment-vader"):
        score_run(store, [("gender", {}), ("sentiment-vadr", {})], CTX, use_ray=False)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['modle'\]"):
        score_run(store, [("gender", {}), ("perplexity", {"modle": "x"})], CTX, use_ray=False)
    with pytest.raises(ValueError, match=r"scorer\(s\) \['gender'\] listed twice"):
        score_run(store, [("gender", {}), ("gender", {})], CTX, use_ray=False)
    assert store.scorers() == []


def test_a_scorer_that_cannot_start_does_not_stop_the_others(tmp_path: Path) -> None:
    store = make_run(tmp_path / "run")
    scorers = [("perplexity", {"model": "tiny-random/gpt3"}), ("gender", {})]
    with pytest.raises(
        ScoringError, match="perplexity: cannot start: ScorerError.*tiny-random/gpt3"
    ) as err:
        score_run(store, scorers, CTX, use_ray=False, progress=False)
    assert err.value.stats["gender"]["scored"] == 6
    assert store.read_scores("gender", "gender").height == 6


@pytest.mark.slow
def test_ray_actors_score_concurrently_like_the_plain_classes(
    tmp_path: Path, ray_local: None
) -> None:
    plain = make_run(tmp_path / "plain")
    remote = make_run(tmp_path / "ray")
    scorers = [
        ("gender", {}),
        ("sentiment-vader", {}),
        ("perplexity", {"model": "tiny-random/gpt2"}),
    ]
    score_run(plain, scorers, CTX, use_ray=False, progress=False)
    stats = score_run(remote, scorers, CTX, use_ray=True, batch_size=2, progress=False)
    assert {n: s["scored"] for n, s in stats.items()} == {
        "gender": 6,
        "sentiment-vader": 6,
        "perplexity": 6,
    }
    for name, metric, col in [
        ("sentiment-vader", "sentiment", "sentiment"),
        ("perplexity", "perplexity", "perplexity"),
    ]:
        a = plain.read_scores(name, metric).sort("job_id")
        b = remote.read_scores(name, metric).sort("job_id")
        assert a["status"].to_list() == b["status"].to_list()
        assert b[col].fill_null(-1.0).to_list() == pytest.approx(
            a[col].fill_null(-1.0).to_list(), rel=1e-6
        )
    broken = [
        ("gender", {}),
        ("sentiment-vader", {}),
        ("perplexity", {"model": "tiny-random/gpt3"}),
    ]
    with pytest.raises(
        ScoringError,
        match="perplexity: cannot start: ScorerError: scorer 'perplexity', parameter model: unknown tiny",
    ) as err:
        score_run(remote, broken, CTX, use_ray=True, progress=False)
    assert {n: s["scored"] for n, s in err.value.stats.items()} == {
        "gender": 0,
        "sentiment-vader": 0,
    }

"""Aggregation in bounded memory and on two threads (issue 34, item 7): the shortcuts give the
numbers of the plain computation. Memory and time themselves are measured by
`benchmarks/bench_aggregate.py`, never here."""

from __future__ import annotations

from math import comb
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from fake_run import score_row, write_rows
from test_stats_pins import pinned_frame

from results.stats import block_rows, emt
from results.stats.aggregate import summarize
from results.stats.join import join_run


@pytest.mark.parametrize("kind", ["paired", "unpaired"])
def test_threads_do_not_change_the_summary(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    frame = pinned_frame(kind, 4)
    got = {}
    for threads in (1, 2):
        monkeypatch.setattr(block_rows, "THREADS", threads)
        got[threads] = summarize(frame, n_boot=60, n_perm=40, seed=2).summary
    assert got[1].equals(got[2], null_equal=True)  # the same rows, in order, to the last bit


def test_max_weights_are_the_probabilities_of_the_maximum() -> None:
    for m in (1, 2, 4):
        table = emt.max_weights(7, m)
        for n in range(8):
            for i in range(8):
                want = comb(i - 1, m - 1) / comb(n, m) if m <= i <= n else 0.0
                assert table[n, i] == pytest.approx(want, rel=1e-12), (m, n, i)
        assert np.allclose(table[m:].sum(axis=1), 1.0)  # a distribution for every n >= m


@pytest.mark.parametrize("m", [None, 1, 2, 3])
def test_labelled_emts_with_runs_are_those_without(m: int | None) -> None:
    rng = np.random.default_rng(5)
    prompt = np.sort(rng.integers(0, 40, 400))
    value = rng.random(prompt.size)
    order = np.lexsort((value, prompt))
    labels = rng.integers(0, 3, (4, prompt.size))
    plain = emt.labelled_emts(labels, prompt, value, 3, m)  # sorts and finds the runs itself
    runs = emt.prompt_runs(prompt[order])
    fast = emt.labelled_emts(labels[:, order], prompt[order], value[order], 3, m, runs)
    assert np.array_equal(plain, fast, equal_nan=True)
    if m is not None:  # the weighted maxima are the expected maxima of every (r, g, p) cell
        sums, ok = emt.expected_max_cells(labels, prompt, value, 3, 40, m)
        with np.errstate(invalid="ignore"):
            direct = sums.sum(axis=2) / ok.sum(axis=2)
        assert np.allclose(plain, direct, equal_nan=True, rtol=1e-12)


def test_join_puts_scores_beside_generations_and_scorers_as_constants(tmp_path: Path) -> None:
    rows = [
        {"prompt_id": f"p{i}", "label": "female", "sentiment": 0.1 * i, "toxicity": 0.2}
        for i in range(5)
    ]
    store = write_rows(str(tmp_path / "run"), rows)
    # j00001 scored twice at one version (a rewritten shard): one row per (job id, version)
    again = [score_row("j00001", "sentiment", sentiment=0.9)]
    store.write_scores("sentiment-vader", "sentiment", again)
    assert store.read_scores("sentiment-vader", "sentiment").height == 5
    frame = join_run(store).frame
    assert frame["job_id"].to_list() == [f"j{i:05d}" for i in range(5)]  # generation order
    assert frame["sentiment"].to_list()[2:] == pytest.approx([0.2, 0.3, 0.4])
    assert frame["sentiment_scorer"].unique().to_list() == ["sentiment-vader"]
    assert frame["toxicity_version"].unique().to_list() == ["v1"]
    assert frame.filter(pl.col("toxicity_status").is_null()).is_empty()

"""The statistics of human preference against simulated annotators with a known truth.

Seeded and CI-sized by default (200 replications of 500 items for the intervals' coverage);
`LIDAO_HUMAN_SIM=full` runs the full sweep (2000 replications, 2 and 3 annotators; 20000 for
the sign test's level) and prints the numbers docs/human-eval.md quotes
(`LIDAO_HUMAN_SIM=full .venv/bin/python -m pytest -s tests/test_human_stats.py`).

The simulation: item i has its own preference probabilities p_i ~ Dirichlet(2 · rates), so
the answers to one item agree more than chance (κ > 0) and the true pooled portions are the
rates; each annotator answers item i from p_i; items come in pairs (the resampling unit).
"""

from __future__ import annotations

import math
import os

import numpy as np
import polars as pl
import pytest

from results.human.preference import OUTCOMES, item_votes, kappa, preference_rows, sign_test

FULL = os.environ.get("LIDAO_HUMAN_SIM") == "full"
RATES = (0.4, 0.3, 0.3)


def simulate(
    rng: np.random.Generator, rates: tuple[float, ...], items: int, raters: int
) -> np.ndarray:
    """(items, raters) answers: indices into OUTCOMES (method, tie, reference)."""
    p = rng.dirichlet(2.0 * np.asarray(rates), size=items)
    return (rng.random((items, raters))[..., None] > p.cumsum(axis=1)[:, None, :]).sum(axis=-1)


def answers_frame(codes: np.ndarray, cell: str) -> pl.DataFrame:
    items, raters = codes.shape
    item = np.repeat(np.arange(items), raters)
    return pl.DataFrame(
        {
            "model": cell,
            "task": "sentiment",
            "method": "lidao-min",
            "reference": "uddia",
            "criterion": "fluency",
            "set_id": "sim",
            "annotator": np.tile([f"r{j}" for j in range(raters)], items),
            "item_id": [f"i{i}" for i in item],
            "prompt_id": [f"i{i}" for i in item],
            "unit": [f"pair{i // 2}" for i in item],
            "preferred": np.asarray(OUTCOMES)[codes.ravel()],
        }
    )


@pytest.mark.parametrize("raters", [2, 3] if FULL else [2])
def test_portions_fall_in_their_intervals_at_the_stated_coverage(raters: int) -> None:
    reps = 2000 if FULL else 200
    rng = np.random.default_rng(20240)
    frames = [answers_frame(simulate(rng, RATES, 500, raters), f"rep{r:04d}") for r in range(reps)]
    rows = preference_rows(pl.concat(frames), seed=7, n_boot=1000, level=0.95)
    pooled = rows.filter((pl.col("group") == "all") & pl.col("stat").str.starts_with("share_"))
    assert pooled.height == 3 * reps and set(pooled["n"]) == {500 * raters}
    truth = pl.DataFrame({"stat": [f"share_{o}_vs_uddia" for o in OUTCOMES], "truth": RATES})
    cover = (
        pooled.join(truth, on="stat")
        .group_by("stat")
        .agg(
            ((pl.col("ci_low") <= pl.col("truth")) & (pl.col("truth") <= pl.col("ci_high"))).mean()
        )
    )
    slack = 3 * math.sqrt(0.95 * 0.05 / reps)  # three binomial standard errors
    print(f"\ncoverage of the 95% intervals, {raters} annotators, {reps} replications:")
    for stat, share in sorted(cover.iter_rows()):
        print(f"  {stat}: {share:.3f}")
        assert abs(share - 0.95) <= slack, (stat, share)


def cohen_by_hand(a: list[int], b: list[int], k: int) -> float:
    """Cohen's κ from the k × k table of the two raters' answers."""
    table = [[0] * k for _ in range(k)]
    for x, y in zip(a, b):
        table[x][y] += 1
    n = len(a)
    observed = sum(table[c][c] for c in range(k)) / n
    chance = sum(sum(table[c]) * sum(row[c] for row in table) for c in range(k)) / n**2
    return (observed - chance) / (1 - chance)


def fleiss_by_hand(counts: list[list[int]]) -> float:
    """Fleiss' κ from the items × categories counts (each row sums to the raters)."""
    n, r = len(counts), sum(counts[0])
    p_items = [(sum(c * c for c in row) - r) / (r * (r - 1)) for row in counts]
    p_cats = [sum(row[j] for row in counts) / (n * r) for j in range(len(counts[0]))]
    p_bar, p_e = sum(p_items) / n, sum(p * p for p in p_cats)
    return (p_bar - p_e) / (1 - p_e)


def test_kappa_matches_an_independent_computation() -> None:
    # Fleiss' worked example (10 items, 14 raters, 5 categories), κ = 0.210 as published.
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]  # fmt: skip
    ratings = np.array([[c for c, k in enumerate(row) for _ in range(k)] for row in table])
    assert kappa(ratings, 5)[0] == pytest.approx(fleiss_by_hand(table), abs=1e-12)
    assert round(kappa(ratings, 5)[0], 3) == 0.210
    rng = np.random.default_rng(3)
    for raters in (2, 3, 5):
        codes = simulate(rng, RATES, 500, raters)
        got, agree = kappa(codes)
        if raters == 2:
            assert got == pytest.approx(cohen_by_hand(*codes.T.tolist(), 3), abs=1e-12)
            assert agree == pytest.approx(np.mean(codes[:, 0] == codes[:, 1]))
        else:
            counts = [[int((row == c).sum()) for c in range(3)] for row in codes]
            assert got == pytest.approx(fleiss_by_hand(counts), abs=1e-12)
        assert 0.1 < got < 0.5  # the items' own preferences: more agreement than chance
    assert math.isnan(kappa(np.zeros((4, 2), dtype=np.int64))[0])  # one category: undefined


def test_sign_test_is_exact_and_holds_its_level_at_no_preference() -> None:
    assert sign_test(1, 9) == sign_test(9, 1) == 2 * (1 + 10) / 2**10  # 2 P(X <= 1), n = 10
    assert sign_test(5, 5) == 1.0 and math.isnan(sign_test(0, 0))
    assert sign_test(0, 3) == 0.25
    reps = 20000 if FULL else 2000
    rng = np.random.default_rng(11)
    rejected, power = 0, 0
    for rep in range(reps):
        for rates in ((0.35, 0.3, 0.35), RATES)[: 2 if rep < 200 else 1]:
            codes = simulate(rng, rates, 500, 2)
            wins, losses = item_votes(codes.ravel(), np.repeat(np.arange(500), 2))
            hit = sign_test(wins, losses) < 0.05
            rejected += hit and rates[0] == rates[2]
            power += hit and rates[0] != rates[2]
    level = rejected / reps
    print(f"\nsign test at no preference: rejects {level:.4f} at 0.05 ({reps} replications); "
          f"power at {RATES}: {power / 200:.2f}")  # fmt: skip
    assert level <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    assert power / 200 > 0.8  # and it does reject a real preference

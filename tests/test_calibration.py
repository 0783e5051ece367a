"""Known-truth calibration of every gap test, the count-matched EMT and the bias-corrected TV.

Data: `calib_sim.simulate` (pairs with a pair effect and a per-prompt effect, several samples
per prompt; groups either the prompt's or drawn per row, 35% / 65%, unrelated to the score).
Fixed seeds; numpy only (the functions `summarize` calls per cell). docs/statistics.md quotes
the numbers `scripts/stats_calibration.py` measures with the same simulator.
"""

from __future__ import annotations

import numpy as np
import pytest
from calib_sim import analyse, simulate, true_tv

from results.stats import emt
from results.stats import permutation as perm

REPS = 600  # rejection rate of an exact 5% test: sd 0.009


@pytest.mark.parametrize("view", ["prompt", "row"])
@pytest.mark.parametrize("metric", ["sentiment", "toxicity", "toxicity_cm", "regard"])
def test_every_gap_test_holds_its_level_under_no_difference(metric: str, view: str) -> None:
    rng = np.random.default_rng(100)
    outs = [analyse(simulate(rng, metric, view), metric, r, n_boot=0) for r in range(REPS)]
    expected = perm.PAIR_SWAP if view == "prompt" else perm.WITHIN_PROMPT
    assert {o.test for o in outs} == {expected}
    rejected = float(np.mean([o.p_value < 0.05 for o in outs]))
    assert rejected <= 0.07, (metric, view, rejected)


def test_k3_range_test_holds_its_level() -> None:
    rng = np.random.default_rng(101)
    outs = [
        analyse(simulate(rng, "sentiment", "prompt", k=3), "sentiment", r, n_boot=0, n_groups=3)
        for r in range(REPS)
    ]
    assert float(np.mean([o.p_value < 0.05 for o in outs])) <= 0.07


@pytest.mark.parametrize("metric", ["sentiment", "regard"])
def test_the_tests_detect_a_real_difference(metric: str) -> None:
    rng = np.random.default_rng(102)
    outs = [
        analyse(simulate(rng, metric, "prompt", effect=0.5), metric, r, n_boot=0)
        for r in range(100)
    ]
    assert float(np.mean([o.p_value < 0.05 for o in outs])) >= 0.8


def test_count_matched_emt_interval_covers_zero_with_unequal_row_labels() -> None:
    # Row labels unrelated to toxicity, 35% female: the paper's EMT gap is pushed below 0
    # (fewer rows, smaller maxima); the count-matched one is centred on the true 0.
    rng = np.random.default_rng(103)
    paper, matched = [], []
    for r in range(200):
        data = simulate(rng, "toxicity", "row", n_pairs=80, samples=10)
        paper.append(analyse(data, "toxicity", r, n_perm=0))
        matched.append(analyse(data, "toxicity_cm", r, n_perm=0))
    assert float(np.mean([o.low <= 0 <= o.high for o in matched])) >= 0.90
    assert float(np.mean([o.low <= 0 <= o.high for o in paper])) < 0.5
    assert float(np.mean([o.gap for o in paper])) < -1.0


def test_bias_corrected_tv_is_near_zero_at_a_true_zero_and_near_a_clear_truth() -> None:
    for effect, reps in ((0.0, 200), (0.3, 60)):
        rng = np.random.default_rng(104)
        outs = []
        for r in range(reps):
            data = simulate(rng, "regard", "prompt", n_pairs=175, samples=10, effect=effect, prompt_sd=0.3)  # fmt: skip
            outs.append(analyse(data, "regard", r, n_boot=0, n_perm=100))
        plug_in = float(np.mean([o.gap for o in outs]))
        corrected = float(np.mean([abs(o.bias_corrected) for o in outs]))
        if effect == 0.0:
            assert plug_in > 1.5  # the bias being corrected
            assert corrected <= 0.4 * plug_in, (plug_in, corrected)
        else:
            assert abs(corrected - true_tv(effect, 0.5, 0.3)) <= 1.0, corrected


def test_expected_max_of_m_rows_is_exact() -> None:
    from itertools import combinations

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 4, 30)
    group = rng.integers(0, 2, 30)
    value = rng.random(30)
    sums, eligible = emt.expected_max_cells(group[None, :], prompt, value, 2, 4, 3)
    for g in range(2):
        for q in range(4):
            rows = value[(group == g) & (prompt == q)]
            assert eligible[0, g, q] == (rows.size >= 3)
            if rows.size >= 3:
                brute = np.mean([max(c) for c in combinations(rows, 3)])
                assert sums[0, g, q] == pytest.approx(brute, rel=1e-9)
    assert emt.matched_rows([np.array([0, 4, 5, 6, 7]), np.array([3, 3, 9])]) == 3

"""Known-truth simulations of the gap intervals, permutation p-values and paired comparisons.

Each replication draws a synthetic paired data set (female and male prompt of each pair, a
per-pair effect shared by both, samples per prompt) with a known true gap, and checks what the
harness's statistics say about it. Seeds are fixed; everything is numpy, so 200 replications
take seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import pytest

from results.stats import bootstrap as bs
from results.stats import permutation as perm
from results.stats.aggregate import summarize
from results.stats.join import join_run
from tests.fake_run import write_rows

REPS = 200
N_BOOT = 400


class Sim(NamedTuple):
    group: np.ndarray  # (N,) 0 female, 1 male
    prompt: np.ndarray  # (N,) prompt index; prompt 2i is pair i's female one, 2i+1 its male one
    value: np.ndarray
    unit_of: np.ndarray  # (P,) pair of each prompt


def paired_sim(
    rng: np.random.Generator,
    gap: float,
    n_pairs: int = 30,
    samples: int = 2,
    pair_sd: float = 0.2,
    noise_sd: float = 0.1,
) -> Sim:
    """Scores = 0.5 + pair effect + gap (female only) + noise; `gap` in score units."""
    pair_effect = rng.normal(0.0, pair_sd, n_pairs)
    prompt = np.repeat(np.arange(2 * n_pairs), samples)
    group = prompt % 2
    pair = prompt // 2
    value = 0.5 + pair_effect[pair] + np.where(group == 0, gap, 0.0)
    value = value + rng.normal(0.0, noise_sd, prompt.size)
    return Sim(group, prompt, value, np.arange(2 * n_pairs) // 2)


def covers(
    sim: Sim, truth: float, metric: str, seed: int, by_pair: bool = True
) -> tuple[bool, float]:
    n_u = int(sim.unit_of.max()) + 1 if by_pair else sim.unit_of.size
    unit_of = sim.unit_of if by_pair else None
    w = bs.prompt_weights(n_u, N_BOOT, seed, "sim")
    gaps = bs.gap_samples(metric, sim.group, sim.prompt, sim.value, 2, w, unit_of)
    ci = bs.percentile_ci(gaps[1:])
    return bool(ci.low <= truth <= ci.high), ci.high - ci.low


@pytest.mark.parametrize("metric", ["sentiment", "toxicity"])
@pytest.mark.parametrize("gap", [0.0, 0.10])
def test_signed_gap_interval_covers_the_truth(metric: str, gap: float) -> None:
    rng = np.random.default_rng(11)
    hits = []
    for r in range(REPS):
        sim = paired_sim(rng, gap, samples=1 if metric == "toxicity" else 2)
        hits.append(covers(sim, 100.0 * gap, metric, seed=r)[0])
    coverage = float(np.mean(hits))
    assert coverage >= 0.9, coverage
    assert coverage <= 0.995  # an honest 95% interval, not an always-wide one


def test_pair_resampling_is_narrower_and_still_calibrated() -> None:
    rng = np.random.default_rng(5)
    by_pair, by_prompt = [], []
    for r in range(REPS):
        sim = paired_sim(rng, 0.05, pair_sd=0.3)
        by_pair.append(covers(sim, 5.0, "sentiment", r, by_pair=True))
        by_prompt.append(covers(sim, 5.0, "sentiment", r, by_pair=False))
    cov_pair, width_pair = np.mean([c for c, _ in by_pair]), np.mean([w for _, w in by_pair])
    cov_prompt, width_prompt = (
        np.mean([c for c, _ in by_prompt]),
        np.mean([w for _, w in by_prompt]),
    )
    assert cov_pair >= 0.9
    assert width_pair < 0.6 * width_prompt, (width_pair, width_prompt)
    assert cov_prompt > 0.99  # prompt resampling ignores the pairs: too wide


def regard_sim(rng: np.random.Generator, shift: float, n_pairs: int = 40) -> Sim:
    """Regard classes 0..2; the female prompts' probabilities shifted towards positive."""
    prompt = np.repeat(np.arange(2 * n_pairs), 2)
    group = prompt % 2
    base = np.array([0.3, 0.4, 0.3])
    fem = base + np.array([-shift, 0.0, shift])
    u = rng.random(prompt.size)
    cdf = np.where(group[:, None] == 0, np.cumsum(fem)[None, :], np.cumsum(base)[None, :])
    value = (u[:, None] > cdf).sum(axis=1).astype(np.float64)
    return Sim(group, prompt, value, np.arange(2 * n_pairs) // 2)


def test_tv_pair_swap_p_value_is_calibrated_and_has_power() -> None:
    rng = np.random.default_rng(3)
    null_p: list[float] = []
    alt_p: list[float] = []
    for r in range(REPS):
        for shift, out in ((0.0, null_p), (0.25, alt_p)):
            sim = regard_sim(rng, shift)
            w = bs.prompt_weights(40, 1, r, "sim")
            observed = bs.gap_samples(
                "regard", sim.group, sim.prompt, sim.value, 2, w, sim.unit_of
            )[0]
            test = perm.gap_test(
                "regard", sim.group, sim.prompt, sim.value, 2, observed, 200,
                np.random.default_rng(r), sim.unit_of, paired=True,
            )  # fmt: skip
            assert test.test == perm.PAIR_SWAP
            out.append(test.p_value)
    reject_null = float(np.mean(np.array(null_p) < 0.05))
    assert reject_null <= 0.07, reject_null
    assert float(np.mean(np.array(alt_p) < 0.05)) >= 0.8


def test_pair_swap_moves_whole_prompts_between_the_two_groups_of_a_pair() -> None:
    # Two pairs, two rows per prompt; prompts 0, 2 female, 1, 3 male.
    group = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    prompt = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    labels, test = perm.null_labels(group, prompt, np.array([0, 0, 1, 1]), True, 64, _rng(0))
    assert test == perm.PAIR_SWAP
    assert np.all(labels[:, 0] == labels[:, 1]) and np.all(labels[:, 4] == labels[:, 5])
    assert np.all(labels[:, 0] != labels[:, 2]) and np.all(labels[:, 4] != labels[:, 6])
    assert {tuple(r) for r in labels[:, [0, 4]]} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    # Row labels (a(x)): shuffled within each prompt, each prompt keeps its label counts.
    rows = np.array([0, 1, 1, 0, 0, 1, 1, 1])
    labels, test = perm.null_labels(rows, prompt, np.array([0, 0, 1, 1]), True, 64, _rng(0))
    assert test == perm.WITHIN_PROMPT
    for q in range(4):
        assert np.all(labels[:, prompt == q].sum(axis=1) == rows[prompt == q].sum())


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_labels_are_shuffled_only_within_strata() -> None:
    group = np.array([0, 1, 0, 1, 1, 0])
    strata = np.array([0, 0, 1, 1, 2, 2])
    chunks = perm.label_chunks(group, strata, 50, np.random.default_rng(0))
    shuffled = np.vstack([c.copy() for c in chunks])
    for s in range(3):
        cols = shuffled[:, strata == s]
        assert np.all(np.sort(cols, axis=1) == [0, 1])  # each pair keeps one of each label
    assert len({tuple(r) for r in shuffled}) > 1


def test_comparison_of_identical_gaps_has_p_one_and_zero_interval() -> None:
    rng = np.random.default_rng(0)
    sim = paired_sim(rng, 0.05)
    w = bs.prompt_weights(30, N_BOOT, 0, "sim")
    gaps = bs.gap_samples("sentiment", sim.group, sim.prompt, sim.value, 2, w, sim.unit_of)
    same = bs.compare_gaps(gaps[1:], gaps[1:].copy(), point=(gaps[0], gaps[0]))
    assert same.p_value == 1.0 and same.low == 0.0 and same.high == 0.0 and same.diff == 0.0
    fair = paired_sim(np.random.default_rng(1), 0.0)
    fair_gaps = bs.gap_samples("sentiment", fair.group, fair.prompt, fair.value, 2, w, fair.unit_of)
    biased = bs.gap_samples(
        "sentiment",
        sim.group,
        sim.prompt,
        sim.value + np.where(sim.group == 0, 0.1, 0.0),
        2,
        w,
        sim.unit_of,
    )
    real = bs.compare_gaps(fair_gaps[1:], biased[1:], point=(fair_gaps[0], biased[0]))
    assert real.p_value < 0.01 and real.high < 0 and real.diff < 0


def test_k3_gap_is_the_range_and_an_empty_group_makes_it_undefined() -> None:
    group = np.array([0, 0, 1, 1, 2, 2])
    prompt = np.arange(6)
    value = np.array([0.1, 0.3, 0.5, 0.5, 0.9, 0.7])
    w = np.ones((1, 6))
    gaps = bs.gap_samples("sentiment", group, prompt, value, 3, w)
    assert gaps[0] == pytest.approx(100 * (0.8 - 0.2))
    absent = bs.gap_samples("sentiment", group[:4], prompt[:4], value[:4], 3, w)
    assert np.isnan(absent).all()


def test_a_pair_swap_over_few_pairs_says_how_small_p_can_get() -> None:
    group = np.array([0, 1, 0, 1, 0, 1])  # three pairs, one row per prompt
    prompt = np.arange(6)
    value = np.array([0.9, 0.1, 0.8, 0.2, 0.7, 0.3])
    test = perm.gap_test(
        "sentiment", group, prompt, value, 2, 60.0, 200, _rng(0), prompt // 2, True
    )
    assert test.test == perm.PAIR_SWAP and test.p_value >= 2 / 8
    assert test.note is not None and "only 3 pair(s)" in test.note and "0.25" in test.note


def test_unpaired_prompt_labels_are_permuted_over_all_prompts() -> None:
    group = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    prompt = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    labels, test = perm.null_labels(group, prompt, np.arange(4), False, 200, _rng(1))
    assert test == perm.PROMPT_SHUFFLE
    assert np.all(labels[:, ::2] == labels[:, 1::2])  # a prompt's rows keep one label
    assert np.all(labels.sum(axis=1) == group.sum())  # two prompts per group, as observed
    # Prompts 0 and 1 share a group in some labellings: no pair keeps them apart.
    assert np.any(labels[:, 0] == labels[:, 2])
    paired, _ = perm.null_labels(group, prompt, np.array([0, 0, 1, 1]), True, 200, _rng(1))
    assert np.all(paired[:, 0] != paired[:, 2])


def _rows(female: tuple[int, int], male: tuple[int, int], sparse_ax: bool) -> list[dict[str, Any]]:
    """24 pairs; female prompts keep `female` (low, high) rows, male `male` (toxicity unrelated
    to the group); a(x) labels half the rows female, or (`sparse_ax`) 1 in 12."""
    rng = np.random.default_rng(11)
    rows = []
    for p in range(24):
        for group, (lo, hi) in (("female", female), ("male", male)):
            for s in range(int(rng.integers(lo, hi + 1))):
                z, u = rng.normal(), rng.random()  # (the same draws whatever the labels)
                rows.append({
                    "prompt_id": f"{group}:{p:03d}", "pair_id": f"{p:03d}", "prompt_group": group,
                    "seed": s, "label_c": group, "label_cx": group, "task": "toxicity",
                    "label_x": "female" if (u < 1 / 12 if sparse_ax else s % 2) else "male",
                    "toxicity": float(1 / (1 + np.exp(2 - z))), "sentiment": float(0.5 + 0.1 * z),
                })  # fmt: skip
    return rows


def test_uneven_rows_per_prompt_mark_the_papers_emt_test_and_a_sparse_view_keeps_its_own_m(
    tmp_path: Path,
) -> None:
    from results.report.build import markdown_table
    from results.report.cells import table_cells
    from results.report.html import paper_table_html
    from results.report.tables import layout, legend, table_legend
    from results.report.tex import latex_table

    summaries = []
    for i, data in enumerate(
        (_rows((1, 2), (6, 8), False), _rows((6, 6), (6, 6), False), _rows((6, 6), (6, 6), True))
    ):
        joined = join_run(write_rows(str(tmp_path / f"run{i}"), data))
        summaries.append(summarize(joined.frame, joined.failed, n_boot=50, n_perm=100).summary)
    s = summaries[0]
    gap = {(r["view"], r["stat"]): r for r in s.filter(pl.col("group") == "gap").iter_rows(named=True)}  # fmt: skip
    assert gap[("file", "bias")]["flags"] == "row-counts"
    assert "test moves (mean rows per prompt female 1." in gap[("file", "bias")]["note"]
    assert gap[("file", "bias_cm")]["flags"] is None  # count-matched: counts held fixed
    assert gap[("a(x)", "bias")]["flags"] is None  # within-prompt: counts held fixed
    assert summaries[1].filter(pl.col("flags") == "row-counts").is_empty()  # equal counts
    # Labelling a(x) sparsely changes a(x)'s m, never the file view's statistic.
    m = [dict(x.filter(pl.col("stat") == "cm_rows").select("view", "value").iter_rows()) for x in summaries[1:]]  # fmt: skip
    assert m[0] == {"a(x)": 3, "a(c,x)": 6, "a(c)": 6, "file": 6} and m[1]["a(x)"] == 1
    keys = ["view", "metric", "stat", "group", "value", "ci_low", "ci_high", "p_value"]
    file_cm = [x.filter((pl.col("view") == "file") & pl.col("stat").is_in(["bias_cm", "emt_cm"])).select(keys) for x in summaries[1:]]  # fmt: skip
    assert file_cm[0].equals(file_cm[1])
    assert (
        "m collapsed to 1 by the few rows per prompt of female"
        in (
            summaries[2].filter((pl.col("view") == "a(x)") & (pl.col("stat") == "bias_cm"))["note"][
                0
            ]
        )
    )
    # The mark reaches every format, with a warning for the cell and the reason in the legend.
    lay = layout(table_cells(s), "file")
    assert "¶" in markdown_table(lay) and "¶" in paper_table_html(lay)
    assert r"\textsuperscript{\P}" in latex_table(lay, "t", "tab:x")
    assert any(
        w.startswith(
            "¶ tiny-random/gpt2 vanilla · Bias (Toxicity): rows per prompt differ between the prompts its test moves (mean female 1."
        )
        for w in lay.warnings
    )
    assert "¶" in table_legend(lay) and "¶: the paper's EMT" in legend(50, 0)


def test_rows_per_prompt_of_one_mean_and_another_spread_mark_every_papers_emt_p() -> None:
    # Female prompts keep 4 rows, male 1 or 7 (the same mean): the paper's EMT rejects far
    # more than 5 % of null runs, and every one of its p-values is marked ¶ (NaN: unmarked).
    from calib_sim import analyse, simulate, spread

    rng = np.random.default_rng(12)
    for female, male, marked in (((4,), (1, 7), True), ((4,), (4,), False)):
        outs = [
            analyse(
                spread(rng, simulate(rng, "toxicity", "prompt", 40, samples=8), female, male),
                "toxicity",
                r,
                n_boot=0,
                n_perm=60,
            )  # fmt: skip
            for r in range(120)
        ]
        assert all(np.isnan(o.counts_p) != marked for o in outs)
        type_1 = float(np.mean([o.p_value < 0.05 for o in outs]))
        assert type_1 > 0.1 if marked else type_1 <= 0.07


def test_the_gender_note_only_where_no_label_column_is_there(tmp_path: Path) -> None:
    joined = join_run(write_rows(str(tmp_path / "run"), _rows((2, 2), (2, 2), False)))
    notes = summarize(joined.frame, joined.failed, n_boot=20, n_perm=20).notes
    assert not [n for n in notes if "no gender scorer" in n]
    bare = joined.frame.drop("label_x", "label_cx", "label_c")
    notes = summarize(bare, joined.failed, n_boot=20, n_perm=20).notes
    assert "no gender scorer ran: only the `file` view (prompt file) is available" in notes


def test_the_papers_emt_within_prompts_is_marked_against_its_null_centre() -> None:
    # Row labels unrelated to toxicity (no composition): the paper's EMT interval sits on the
    # row-count shift of its null, so against 0 it "disagrees" with the test in many null
    # runs; against the null's centre, about as often as the other gaps.
    from calib_sim import analyse, simulate

    from results.stats.block_rows import _disagree

    rng = np.random.default_rng(13)
    against_centre, against_zero = [], []
    for r in range(150):
        o = analyse(simulate(rng, "toxicity", "row", 40, samples=8), "toxicity", r, n_boot=200, n_perm=100)  # fmt: skip
        ci = {"ci_low": o.low, "ci_high": o.high}
        test = perm.GapTest(o.p_value, perm.WITHIN_PROMPT, o.centre, None)
        against_centre.append(_disagree("toxicity", test, ci, 0.95, 2) is not None)
        against_zero.append((o.low > 0 or o.high < 0) != (o.p_value < 0.05))
    assert np.mean(against_zero) > 0.15 and np.mean(against_centre) <= 0.08


def test_the_human_table_marks_small_sets_and_zero_width_intervals() -> None:
    from results.report.human import _cells, human_legend

    def got(n: int, low: float, high: float) -> dict[str, Any]:
        row = {"value": 0.5, "ci_low": low, "ci_high": high, "n": n, "p_value": None}
        return {k: row for k in ("share_method", "share_tie", "share_reference")}

    one_pair = _cells(got(30, 0.5, 0.5), 0.95)  # a 1-pair set: nothing to resample
    assert one_pair[0][:2] == ("0.500†", "[0.50, 0.50]")
    assert _cells(got(12, 0.3, 0.7), 0.95)[0][0] == "0.500†"  # fewer than 20 answers
    assert _cells(got(40, 0.3, 0.7), 0.95)[0][0] == "0.500"
    assert "†: fewer than 20 answers, or an interval of zero width" in human_legend(0.95)

"""Aggregation: hand-computed metric cases (tests/cases), joins, bootstrap determinism."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from fake_run import score_row, synthetic_run, write_rows

from results.run.store import RunStore, StoreError
from results.stats import bootstrap as bs
from results.stats import permutation as perm
from results.stats.aggregate import summarize
from results.stats.join import JoinError, join_run

CASES = json.loads((Path(__file__).parent / "cases" / "aggregate_metrics.json").read_text())[
    "cases"
]
VALUE_KEYS = {"value", "n", "ci_low", "ci_high", "n_boot"}


def run_case(
    tmp_path: Path, case: dict[str, Any], n_boot: int = 50
) -> tuple[pl.DataFrame, list[str]]:
    store = write_rows(str(tmp_path / "run"), case["rows"])
    joined = join_run(store)
    agg = summarize(joined.frame, joined.failed, groups=case.get("groups"), n_boot=n_boot)
    return agg.summary, joined.notes + agg.notes


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_metric_case(tmp_path: Path, case: dict[str, Any]) -> None:
    summary, notes = run_case(tmp_path, case)
    for want in case["expect"]:
        sel = summary.filter(*[pl.col(k) == v for k, v in want.items() if k not in VALUE_KEYS])
        assert sel.height == 1, f"{want}: {sel.height} matching summary rows"
        got = sel.row(0, named=True)
        for key in VALUE_KEYS & set(want):
            if want[key] is None:
                assert got[key] is None, f"{want}: {key} = {got[key]}, expected null"
            else:
                assert got[key] == pytest.approx(want[key], abs=case.get("tol", 1e-9)), (
                    f"{want}: {key}"
                )
    for text in case.get("notes_contain", []):
        assert any(text in n for n in notes), f"no note contains {text!r}: {notes}"


def test_gap_point_estimate_equals_difference_of_group_means(tmp_path: Path) -> None:
    summary, _ = run_case(tmp_path, {"rows": [], "expect": []} | {"rows": _random_rows(40)})
    a = summary.filter((pl.col("view") == "a(x)") & (pl.col("metric") == "sentiment"))
    mean = {
        r["group"]: r["value"] for r in a.filter(pl.col("stat") == "mean").iter_rows(named=True)
    }
    bias = a.filter(pl.col("stat") == "bias")["value"][0]
    assert bias == pytest.approx((mean["female"] - mean["male"]) * 100)  # signed: f − m


def _random_rows(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "prompt_id": f"p{i % 10}",
            "label": str(rng.choice(["female", "male", "none"])),
            "sentiment": float(rng.uniform()),
        }
        for i in range(n)
    ]


def test_bootstrap_is_deterministic_per_seed(tmp_path: Path) -> None:
    store = synthetic_run(
        str(tmp_path / "run"), methods=("vanilla", "lidao-min"), tasks=("sentiment",)
    )
    joined = join_run(store)
    first = summarize(joined.frame, joined.failed, seed=3, n_boot=200).summary
    again = summarize(joined.frame, joined.failed, seed=3, n_boot=200).summary
    other = summarize(joined.frame, joined.failed, seed=4, n_boot=200).summary
    assert first.equals(again)
    gaps = pl.col("stat") == "bias"
    assert first.filter(gaps)["value"].equals(other.filter(gaps)["value"])  # points do not move
    assert not first.filter(gaps)["ci_low"].equals(other.filter(gaps)["ci_low"])


def test_intervals_of_a_model_do_not_depend_on_other_models(tmp_path: Path) -> None:
    one = synthetic_run(str(tmp_path / "one"), models=("m1",), tasks=("sentiment",))
    two = synthetic_run(str(tmp_path / "two"), models=("m1", "m2"), tasks=("sentiment",))
    rows = []
    for store in (one, two):
        joined = join_run(store)
        s = summarize(joined.frame, joined.failed, n_boot=100).summary
        rows.append(
            s.filter((pl.col("model") == "m1") & (pl.col("stat") == "bias")).sort(
                "method", "view", "metric"
            )
        )
    assert rows[0].equals(rows[1])


def test_prompt_weights_are_resamples_of_all_prompts() -> None:
    w = bs.prompt_weights(7, 50, seed=0, key="m|t")
    assert w.shape == (50, 7)
    assert np.all(w.sum(axis=1) == 7)
    assert np.array_equal(w, bs.prompt_weights(7, 50, seed=0, key="m|t"))
    assert not np.array_equal(w, bs.prompt_weights(7, 50, seed=0, key="m|u"))


def test_paired_comparison_uses_the_same_resamples(tmp_path: Path) -> None:
    # lidao-min: no gap on any prompt; vanilla: female always 0.9, male 0.1; uddia = vanilla.
    rows = []
    for method, (f, m) in {
        "vanilla": (0.9, 0.1),
        "uddia": (0.9, 0.1),
        "lidao-min": (0.5, 0.5),
    }.items():
        for p in range(8):
            rows += [
                {"method": method, "prompt_id": f"p{p}", "label": "female", "sentiment": f},
                {"method": method, "prompt_id": f"p{p}", "label": "male", "sentiment": m},
            ]
    summary, _ = run_case(tmp_path, {"rows": rows}, n_boot=100)
    diffs = summary.filter((pl.col("view") == "a(x)") & pl.col("stat").str.starts_with("diff_vs"))
    got = {(r["method"], r["stat"]): r for r in diffs.iter_rows(named=True)}
    fair = got[("lidao-min", "diff_vs_vanilla")]
    assert fair["value"] == pytest.approx(-80.0) and fair["ci_high"] < 0 and fair["p_value"] < 0.05
    assert got[("lidao-min", "diff_vs_uddia")]["value"] == pytest.approx(-80.0)
    same = got[("uddia", "diff_vs_vanilla")]  # identical gaps: a tie, not a difference
    assert same["value"] == 0.0 and same["p_value"] == 1.0
    assert same["ci_low"] == 0.0 and same["ci_high"] == 0.0
    assert ("vanilla", "diff_vs_vanilla") not in got


def test_interval_brackets_a_clear_gap(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [
        {
            "prompt_id": f"p{p}",
            "label": g,
            "sentiment": float(np.clip(mu + rng.normal(0, 0.1), 0, 1)),
        }
        for p in range(30)
        for g, mu in (("female", 0.7), ("male", 0.4))
    ]
    summary, _ = run_case(tmp_path, {"rows": rows}, n_boot=300)
    gap = summary.filter((pl.col("view") == "a(x)") & (pl.col("stat") == "bias")).row(0, named=True)
    assert gap["ci_low"] < gap["value"] < gap["ci_high"]
    assert 20 < gap["ci_low"] and gap["ci_high"] < 40
    assert gap["n_boot"] == 300


def test_variants_keep_settings_apart(tmp_path: Path) -> None:
    rows = [
        {"prompt_id": "A", "label": "female", "sentiment": 0.2, "temperature": t, "method": "uddia"}
        for t in (0.75, 1.0)
    ]
    summary, _ = run_case(tmp_path, {"rows": rows})
    assert set(summary.filter(pl.col("method") == "uddia")["variant"].to_list()) == {
        "temperature=0.75",
        "temperature=1.0",
    }


# ---- joins ---------------------------------------------------------------------------------


def test_two_scorers_of_one_metric_must_be_chosen(tmp_path: Path) -> None:
    store = write_rows(
        str(tmp_path / "run"), [{"prompt_id": "A", "label": "female", "sentiment": 0.3}]
    )
    store.write_scores(
        "sentiment",
        "sentiment",
        [score_row("j00000", "sentiment", sentiment=0.9) | {"scorer": "sentiment"}],
    )
    with pytest.raises(JoinError, match="sentiment, sentiment-vader"):
        join_run(store)
    frame = join_run(store, {"sentiment": "sentiment"}).frame
    assert frame["sentiment"].to_list() == [0.9]
    assert frame["sentiment_scorer"].to_list() == ["sentiment"]
    with pytest.raises(JoinError, match="no scores"):
        join_run(store, {"toxicity": "perspective"})


def test_latest_scorer_version_wins(tmp_path: Path) -> None:
    rows = [{"prompt_id": p, "label": "female", "sentiment": 0.3} for p in "AB"]
    store = write_rows(str(tmp_path / "run"), rows)
    old = store.list_shards("scores", "sentiment-vader")[0]
    os.utime(old, (1_000_000_000, 1_000_000_000))
    # Re-scored with a new version, only the first job so far: the second has no current score.
    store.write_scores(
        "sentiment-vader",
        "sentiment",
        [score_row("j00000", "sentiment", version="v2", sentiment=0.8)],
    )
    joined = join_run(store)
    assert joined.frame.sort("job_id")["sentiment"].to_list() == [0.8, None]
    assert joined.sources["sentiment"].version == "v2"
    assert any("ignored older ['v1']" in n for n in joined.notes)


def test_unregistered_scorer_metric_is_read_from_its_rows(tmp_path: Path) -> None:
    store = write_rows(str(tmp_path / "run"), [{"prompt_id": "A", "label": "female"}])
    store.write_scores(
        "my-toxicity",
        "toxicity",
        [score_row("j00000", "toxicity", toxicity=0.25) | {"scorer": "my-toxicity"}],
    )
    joined = join_run(store)
    assert joined.sources["toxicity"].scorer == "my-toxicity"
    assert joined.frame["toxicity"].to_list() == [0.25]


def test_no_generations_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no generation rows"):
        join_run(RunStore(str(tmp_path / "empty")))


def test_scorer_choice_maps_names_to_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    from results.stats import join

    registry = {"tox-a": "toxicity", "tox-b": "toxicity", "sent": "sentiment"}
    monkeypatch.setattr(join, "SCORER_METRICS", registry)
    assert join.scorer_choice(["tox-a", "sent"]) == {"toxicity": "tox-a", "sentiment": "sent"}
    with pytest.raises(JoinError, match="both score 'toxicity'"):
        join.scorer_choice(["tox-a", "tox-b"])
    with pytest.raises(JoinError, match="unknown scorer"):
        join.scorer_choice(["tox-c"])


def test_an_empty_scorer_directory_is_ignored(tmp_path: Path) -> None:
    store = write_rows(
        str(tmp_path / "run"), [{"prompt_id": "A", "label": "female", "sentiment": 0.3}]
    )
    store.makedirs("scores", "sentiment")  # a scorer that crashed before its first shard
    assert join_run(store).sources["sentiment"].scorer == "sentiment-vader"


# ---- issue 22: tests per view, count-matched EMT, bias-corrected TV, level, counts ----------


def _paired_rows(n_pairs: int = 12, samples: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """Pairs of a female and a male prompt; a(x) labels drawn per row, a(c) the prompt's."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_pairs):
        effect = rng.normal(0, 0.2)
        for group in ("female", "male"):
            for s in range(samples):
                z = effect + rng.normal(0, 0.2)
                rows.append({
                    "prompt_id": f"{group}:{p:05d}", "pair_id": f"{p:05d}",
                    "prompt_group": group, "seed": s,
                    "label_x": str(rng.choice(["female", "male"], p=[0.35, 0.65])),
                    "label_cx": group, "label_c": group,
                    "sentiment": float(0.5 + z), "toxicity": float(1 / (1 + np.exp(2 - z))),
                    "regard_label": ["negative", "neutral", "positive"][int(np.digitize(z, [-0.1, 0.1]))],
                    "perplexity": 10.0,
                })  # fmt: skip
    return rows


def test_each_view_gets_its_test_and_the_new_statistics(tmp_path: Path) -> None:
    store = write_rows(str(tmp_path / "run"), _paired_rows())
    joined = join_run(store)
    s = summarize(joined.frame, joined.failed, n_boot=100, n_perm=50).summary
    gaps = s.filter(pl.col("group") == "gap")
    test = {(r["view"], r["metric"], r["stat"]): r for r in gaps.iter_rows(named=True)}
    for metric in ("sentiment", "toxicity", "regard"):
        assert test[("a(x)", metric, "bias")]["test"] == perm.WITHIN_PROMPT
        for view in ("a(c)", "file", "a(c,x)"):  # a(c,x) labels here are the prompt's
            assert test[(view, metric, "bias")]["test"] == perm.PAIR_SWAP
            assert 0 < test[(view, metric, "bias")]["p_value"] <= 1
    assert all(test[(v, "regard", "bias")]["p_value"] is not None for v in ("a(x)", "file"))
    cm = test[("a(x)", "toxicity", "bias_cm")]
    m = test[("a(x)", "toxicity", "cm_rows")]["value"]
    assert m >= 1 and f"m={m:g}" in cm["note"] and cm["ci_low"] <= cm["value"] <= cm["ci_high"]
    assert (
        "mixes toxicity with the groups' row counts" in test[("a(x)", "toxicity", "bias")]["note"]
    )
    bc = test[("file", "regard", "bias_bc")]
    assert 0 <= bc["value"] <= test[("file", "regard", "bias")]["value"]
    tv = test[("file", "regard", "bias")]
    assert 0 <= bc["ci_low"] <= bc["ci_high"] and bc["test"] == perm.PAIR_SWAP
    assert bc["mde"] == tv["mde"] > 0 and bc["p_value"] == tv["p_value"]
    assert all(r["mde"] > 0 for k, r in test.items() if k[2] in ("bias", "bias_cm"))
    emt_cm = s.filter((pl.col("stat") == "emt_cm") & (pl.col("view") == "file"))
    assert set(emt_cm["group"]) == {"female", "male"} and (emt_cm["n"] == 12).all()
    assert set(s["level"].unique()) == {0.95}


def test_count_matched_emt_by_hand(tmp_path: Path) -> None:
    # One prompt per group in view file; female rows 0.1, 0.5, 0.9; male rows 0.2, 0.4.
    rows = [
        {"prompt_id": f"{g}:0", "pair_id": "0", "prompt_group": g, "label": g, "toxicity": t}
        for g, ts in (("female", (0.1, 0.5, 0.9)), ("male", (0.2, 0.4)))
        for t in ts
    ]
    store = write_rows(str(tmp_path / "run"), rows)
    joined = join_run(store)
    s = summarize(joined.frame, joined.failed, n_boot=0).summary.filter(pl.col("view") == "file")
    got = {(r["stat"], r["group"]): r["value"] for r in s.iter_rows(named=True)}
    assert got[("cm_rows", "gap")] == 2  # the lower quartile of the row counts (3, 2)
    # E[max of 2 of (0.1, 0.5, 0.9)] = (0.5 + 0.9 + 0.9) / 3; of (0.2, 0.4): 0.4.
    assert got[("emt_cm", "female")] == pytest.approx(2.3 / 3)
    assert got[("bias_cm", "gap")] == pytest.approx(100 * (2.3 / 3 - 0.4))
    assert got[("bias", "gap")] == pytest.approx(100 * (0.9 - 0.4))  # the paper's EMT


def test_level_reaches_every_interval_and_comparison(tmp_path: Path) -> None:
    store = synthetic_run(str(tmp_path / "run"), n_prompts=12, n_seeds=3)
    joined = join_run(store)
    wide = summarize(joined.frame, joined.failed, n_boot=200, level=0.95).summary
    narrow = summarize(joined.frame, joined.failed, n_boot=200, level=0.9).summary
    assert set(narrow["level"].unique()) == {0.9} and set(wide["level"].unique()) == {0.95}
    keys = ["model", "method", "variant", "task", "view", "metric", "stat", "group"]
    both = wide.filter(pl.col("ci_low").is_not_null()).join(narrow, on=keys, suffix="_90")
    assert both.height > 50 and set(both["stat"]) >= {
        "bias",
        "bias_cm",
        "diff_vs_vanilla",
        "diff_cm_vs_uddia",
    }
    assert (both["ci_low"] <= both["ci_low_90"]).all() and (
        both["ci_high_90"] <= both["ci_high"]
    ).all()
    # (bias_bc's resamples are floored at 0 and may tie at both ends: nested only)
    spread = both.filter(
        (pl.col("ci_high") - pl.col("ci_low") > 1e-9) & (pl.col("stat") != "bias_bc")
    )
    narrower = (spread["ci_high_90"] - spread["ci_low_90"]) < (spread["ci_high"] - spread["ci_low"])
    assert narrower.all()


def test_failed_scores_are_counted_per_group_and_named_in_the_gap_note(tmp_path: Path) -> None:
    rows = [
        {"prompt_id": f"{g}:{p}", "pair_id": str(p), "prompt_group": g, "label": g,
         "sentiment": None if g == "female" and p < 9 else 0.5}
        for p in range(18)
        for g in ("female", "male")
    ]  # fmt: skip
    store = write_rows(str(tmp_path / "run"), rows)
    joined = join_run(store)
    s = summarize(joined.frame, joined.failed, n_boot=20).summary
    file = s.filter((pl.col("view") == "file") & (pl.col("metric") == "sentiment"))
    got = {(r["stat"], r["group"]): r for r in file.iter_rows(named=True)}
    assert got[("failed", "female")]["value"] == 9 and got[("missing", "female")]["value"] == 9
    assert got[("failed", "male")]["value"] == 0
    assert "missing scores: female 9 of 18 rows, male 0 of 18 rows" in got[("bias", "gap")]["note"]


def test_a_gap_of_composition_only_notes_that_interval_and_test_disagree(tmp_path: Path) -> None:
    """Prompts that score high yield mostly female continuations, low ones mostly male; within
    a prompt the label is unrelated to the score. The a(x) gap is then real for the interval
    (prompts resampled) and null for the within-prompt test: the row says they disagree."""
    rng = np.random.default_rng(5)
    rows = []
    for p in range(16):
        high = p % 2 == 0
        for group in ("female", "male"):
            for s in range(10):
                rows.append({
                    "prompt_id": f"{group}:{p:05d}", "pair_id": f"{p:05d}",
                    "prompt_group": group, "seed": s,
                    "label_x": "female" if (s < 8) == high else "male",
                    "label_cx": group, "label_c": group,
                    "sentiment": float((0.8 if high else 0.2) + rng.normal(0, 0.05)),
                })  # fmt: skip
    store = write_rows(str(tmp_path / "run"), rows)
    joined = join_run(store)
    s = summarize(joined.frame, joined.failed, n_boot=200, n_perm=200).summary
    bias = {
        r["view"]: r
        for r in s.filter((pl.col("stat") == "bias") & (pl.col("metric") == "sentiment")).iter_rows(
            named=True
        )
    }
    x = bias["a(x)"]
    assert x["test"] == perm.WITHIN_PROMPT and x["p_value"] > 0.05
    assert x["ci_low"] > 0 or x["ci_high"] < 0
    assert "the interval excludes 0 (the paper's EMT: the row-count centre of its null) but the within-prompt test does not reject" in x["note"]  # fmt: skip
    assert x["flags"] == "contradiction"
    from results.report.build import markdown_table
    from results.report.cells import table_cells
    from results.report.tables import layout

    lay = layout(table_cells(s), "a(x)")
    assert lay.p_marks == ["§"] and re.search(r"p=0\.\d{3}§", markdown_table(lay))
    for view in ("a(c)", "file"):  # prompt-labelled: the pair swap, no such note
        assert "disagree" not in (bias[view]["note"] or "")

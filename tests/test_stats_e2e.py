"""End to end through `python -m harness run` and `aggregate`: statistics with a known truth.

The female and male prompt files hold the same texts, so each pair's two prompts get the same
continuations (a job's randomness depends only on its prompt text and seed) and the same
scores: the true gap of the prompt-file view is exactly 0. Also the perplexity filter's
setting and its report, a NaN planted in a score shard, and K = 3 groups with one absent.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml
from fake_run import write_rows

from results.report.build import aggregate_run
from results.run.store import RunStore
from tests import cli_run

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}  # fmt: skip
TEXTS = [
    "The person walked into the room and",
    "My neighbor always told me that",
    "The new teacher was known in the city as a",
    "After the long day at work, the driver",
    "Everyone at the party agreed that the artist",
]


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_run.harness(*args, env=ENV, timeout=600)


@pytest.fixture(scope="module")
def identical_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("identical")
    files = {}
    for group in ("female", "male"):
        path = root / f"{group}.jsonl"
        path.write_text("".join(json.dumps({"prompt": {"text": t}}) + "\n" for t in TEXTS))
        files[group] = str(path)
    cfg = {
        "name": "identical-pairs",
        "dataset": {"kind": "paired-jsonl", "files": files},
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla"],
        "tasks": ["sentiment"],
        "samples_per_prompt": 2,
        "generation": {"max_new_tokens": 12},
        "scorers": ["gender", "sentiment-vader", {"name": "perplexity", "params": {"model": "tiny-random/gpt2"}}],
        "aggregation": {"n_boot": 300, "seed": 1},
    }  # fmt: skip
    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    res = harness(
        "run", str(root / "cfg.yaml"), "--out", str(root / "run"), "--no-ray", "--no-progress"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "run"


def summary_of(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "summary.parquet")


def test_identical_pairs_give_zero_file_bias_with_an_interval_containing_zero(
    identical_run: Path,
) -> None:
    # The tiny model's perplexity is far above 200: the default filter drops every row and
    # the report says so instead of showing empty tables.
    notes = (identical_run / "report" / "tables.md").read_text()
    assert "filter dropped all 20 generations" in notes
    res = harness(
        "aggregate", str(identical_run), "--ppl-max", "1e12", "--n-boot", "300", "--seed", "1", "-q"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "wrote" not in res.stdout and "tables (report/tables.md)" in res.stdout  # -q
    s = summary_of(identical_run)
    gap = s.filter(
        (pl.col("view") == "file") & (pl.col("metric") == "sentiment") & (pl.col("stat") == "bias")
    ).row(0, named=True)
    assert gap["value"] == 0.0 and gap["ci_low"] <= 0.0 <= gap["ci_high"]
    assert gap["resample_unit"] == "pair" and gap["ci_method"] == "percentile"
    assert gap["p_value"] == 1.0 and gap["n"] == 5 and gap["n_boot"] == 300
    report = (identical_run / "report" / "tables.md").read_text()
    assert "a(x)" in report and "no gender scorer ran" not in report  # (the gender scorer ran)
    filt = s.filter(pl.col("metric") == "filter")
    assert set(filt["stat"]) >= {"dropped_ppl>1e+12", "generations"}
    # The score column is the mean over every kept generation: the same in every view.
    means = s.filter(
        (pl.col("metric") == "sentiment") & (pl.col("stat") == "mean") & (pl.col("group") == "all")
    )
    assert means["value"].n_unique() == 1 and means.height == 4


def test_a_nan_planted_in_a_score_shard_changes_only_the_missing_count(
    identical_run: Path, tmp_path: Path
) -> None:
    store = RunStore(str(identical_run))
    scores = store.read_scores("sentiment-vader", "sentiment")
    before = aggregate_run(store, ppl_max=1e12, n_boot=100).summary
    # One extra job: a copy of a generation whose sentiment is NaN (status ok, as an
    # overflowing scorer of an older harness would have written it).
    gens = store.read_generations()
    extra = gens.head(1).with_columns(pl.lit("jNAN").alias("job_id"))
    store.write_generations(extra.to_dicts())
    # Rows outside the plan are never counted (run identity): the planted job joins the plan.
    plan = store.read_plan()
    first = plan.filter(pl.col("job_id") == gens["job_id"][0])
    plan_path = identical_run / "plan.parquet"
    pl.concat([plan, first.with_columns(pl.lit("jNAN").alias("job_id"))]).write_parquet(plan_path)
    nan = scores.head(1).with_columns(
        pl.lit("jNAN").alias("job_id"), pl.lit(float("nan")).alias("sentiment")
    )
    store.write_scores("sentiment-vader", "sentiment", nan.to_dicts())
    labels = store.read_scores("gender", "gender").filter(pl.col("job_id") == gens["job_id"][0])
    renamed = labels.with_columns(pl.lit("jNAN").alias("job_id"))
    store.write_scores("gender", "gender", renamed.to_dicts())  # no perplexity: ppl_missing
    after = aggregate_run(store, ppl_max=1e12, n_boot=100).summary
    keys = ["model", "method", "variant", "task", "view", "metric", "stat", "group"]
    both = before.join(after, on=keys, suffix="_after", nulls_equal=True)
    assert both.height == before.height == after.height
    changed = both.filter(
        ~(pl.col("value").eq_missing(pl.col("value_after")))
        | ~(pl.col("ci_low").eq_missing(pl.col("ci_low_after")))
    )
    # Only the sentiment `missing` counts and the row counts / filter totals grow by one.
    assert set(changed["stat"]) <= {"missing", "n", "generations", "ppl_missing"}, changed
    missing = changed.filter((pl.col("stat") == "missing") & (pl.col("metric") == "sentiment"))
    assert missing.height > 0 and (missing["value_after"] - missing["value"] == 1).all()
    sel = (pl.col("metric") == "sentiment") & (pl.col("stat") == "mean")
    assert after.filter(sel)["value"].null_count() == before.filter(sel)["value"].null_count()
    assert not after.filter(sel)["value"].is_nan().any()


def _k3_rows() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows = []
    for p in range(6):
        for group in ("a", "b"):
            rows.append({
                "prompt_id": f"{group}:{p:05d}", "pair_id": f"{p:05d}", "prompt_group": group,
                "label": group, "sentiment": float(rng.uniform()), "toxicity": float(rng.uniform()),
            })  # fmt: skip
    return rows


def test_k3_groups_with_one_absent_give_an_undefined_gap_with_the_reason(tmp_path: Path) -> None:
    store = write_rows(str(tmp_path / "run"), _k3_rows())
    res = aggregate_run(store, groups=["a", "b", "c"], n_boot=50)
    gaps = res.summary.filter((pl.col("stat") == "bias") & (pl.col("view") == "a(x)"))
    assert gaps.height == 2 and gaps["value"].is_null().all()
    assert all("group(s) c have no scored rows" in n for n in gaps["note"])
    counts = res.summary.filter((pl.col("metric") == "count") & (pl.col("group") == "c"))
    assert (counts["value"] == 0).all() and counts.height > 0  # the absent group shows as such
    assert any("sentiment bias undefined: group(s) c" in n for n in res.notes)
    two = aggregate_run(store, groups=["a", "b"], n_boot=50).summary
    assert (
        two.filter((pl.col("stat") == "bias") & (pl.col("view") == "a(x)"))["value"]
        .is_not_null()
        .all()
    )


def test_groups_come_from_the_config(tmp_path: Path) -> None:
    store = write_rows(str(tmp_path / "run"), _k3_rows())
    words = tmp_path / "words.json"
    words.write_text(json.dumps({"a": ["alpha"], "b": ["beta"], "c": ["gamma"]}))
    (tmp_path / "run" / "config.yaml").write_text(
        yaml.safe_dump({"gender_words": str(words), "aggregation": {"n_boot": 20}})
    )
    res = aggregate_run(store)
    assert res.groups == ("a", "b", "c") and res.n_boot == 20
    assert res.summary.filter(pl.col("stat") == "bias")["value"].is_null().all()


def compare(*argv: str) -> int:
    import argparse

    from harness.cli.compare import add_compare_args, compare_main

    parser = argparse.ArgumentParser()
    add_compare_args(parser)
    return compare_main(parser.parse_args(list(argv)))


def test_compare_a_run_with_itself_gives_p_one_and_a_zero_interval(
    identical_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(identical_run)
    assert compare(run, run, "--ppl-max", "1e12", "--n-boot", "200", "--fail-above", "0") == 0
    out = capsys.readouterr().out
    bias = [line for line in out.splitlines() if " bias " in f" {line} " and "gap" in line]
    defined = [line for line in bias if "[" in line]  # a(c) etc.: one group only, undefined
    assert any(" file " in line for line in defined), bias
    assert all(line.endswith("+0.000    [+0.000, +0.000]  1.000    no") for line in defined), bias


def test_compare_refuses_runs_whose_plans_differ(
    identical_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(identical_run, other)
    plan = pl.read_parquet(other / "plan.parquet")
    plan.with_columns(pl.col("top_p") * 0.5).write_parquet(other / "plan.parquet")
    assert compare(str(identical_run), str(other), "--n-boot", "20") == 2
    assert "generation parameters differ" in capsys.readouterr().err
    code = compare(str(identical_run), str(other), "--n-boot", "20", "--allow-plan-mismatch")
    assert code == 0 and "WARNING: plans differ" in capsys.readouterr().err


def _pair_run(root: Path, dropped: int | None) -> str:
    """30 pairs x 2 samples; pair `dropped`'s rows have a perplexity above the filter."""
    rng = np.random.default_rng(0)
    rows = []
    for p in range(30):
        effect = rng.normal(0, 0.3)
        for group in ("female", "male"):
            for s in range(2):
                rows.append({
                    "prompt_id": f"{group}:{p:05d}", "pair_id": f"{p:05d}", "prompt_group": group,
                    "label": group, "seed": s, "sentiment": float(effect + rng.normal(0, 0.1)),
                    "perplexity": 1e6 if p == dropped else 10.0,
                })  # fmt: skip
    write_rows(str(root), rows)
    return str(root)


def test_compare_drops_a_pair_filtered_in_one_run_from_both_and_stays_paired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli.compare import paired_bias_rows, shared_units
    from results.report.build import summarize_joined
    from results.run.store import RunStore
    from results.stats.aggregate import READ_COLUMNS
    from results.stats.join import join_run

    a, b = _pair_run(tmp_path / "a", None), _pair_run(tmp_path / "b", dropped=3)
    assert compare(a, b, "--n-boot", "200", "--view", "file", "--metric", "sentiment") == 0
    err = capsys.readouterr().err
    assert "1 pair(s) have rows in one run only (1 only in A, 0 only in B" in err
    assert "dropped from both runs" in err and "29 pairs kept" in err
    settings = {"seed": 0, "n_boot": 200, "level": 0.95, "ppl_max": 200.0, "n_perm": 0}
    joined = [join_run(RunStore(r), columns=READ_COLUMNS) for r in (a, b)]
    units, paired, _ = shared_units(joined[0].frame, joined[1].frame, 200.0)
    aligned = [summarize_joined(j, settings, None, units, paired) for j in joined]
    alone = [summarize_joined(j, settings, None) for j in joined]  # each run its own units

    def width(aggs: list[Any]) -> float:
        row = paired_bias_rows(*aggs).filter(
            (pl.col("view") == "file") & (pl.col("metric") == "sentiment")
        )
        return float(row["ci_high"][0] - row["ci_low"][0])

    gap = (
        aligned[0]
        .summary.filter(
            (pl.col("view") == "file")
            & (pl.col("metric") == "sentiment")
            & (pl.col("stat") == "bias")
        )
        .row(0, named=True)
    )
    # The same 29 pairs in both runs: B equals A, the paired difference is exactly 0.
    assert width(aligned) == 0.0 and gap["ci_high"] - gap["ci_low"] > 1.0
    assert width(alone) > 0.5 * (gap["ci_high"] - gap["ci_low"])  # what misalignment costs


def test_compare_marks_at_one_minus_the_level(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.compare import KEYS, print_table

    row = dict.fromkeys(KEYS, "x") | {"a": 1.0, "b": 2.0, "diff": 1.0, "abs_diff": 1.0}
    rows = pl.DataFrame([row | {"ci_low": 0.1, "ci_high": 2.0, "p_value": 0.07}])
    print_table(rows, level=0.9)
    assert capsys.readouterr().out.splitlines()[1].endswith("0.070    yes")
    print_table(rows, level=0.95)
    assert capsys.readouterr().out.splitlines()[1].endswith("0.070    no")

"""The intervals and p-values of `summarize` and of the test kernels, pinned.

`tests/golden/stats_pins.json` was written by the kernels before they were bounded in memory
(whole (resamples × units) weight matrices, (permutations × rows) label matrices: commit
cfd134e, which has issue 30's statistics), with `python tests/test_stats_pins.py --write`. The chunked kernels must give the same
numbers for the same seeds, whatever the chunk size: the tests run them with the default chunks
and with chunks of a few resamples and labellings, so that chunk boundaries fall inside every
statistic.

Tolerance: values and interval bounds within 1e-9 (× 100 units; the same sums in another order
differ by ~1e-15). p-values exactly: they count labellings with |T*| ≥ |T| − 1e-9 |T|, which no
reordering of sums moves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from results.stats import bootstrap as bs
from results.stats import permutation as perm
from results.stats.aggregate import summarize

GOLDEN = Path(__file__).parent / "golden" / "stats_pins.json"
GAP_STATS = ("bias", "bias_cm", "bias_bc", "emt_cm", "diff_vs_vanilla", "diff_cm_vs_vanilla")
KEYS = ["method", "view", "metric", "stat", "group"]
REGARD = np.array(["negative", "neutral", "positive", "other"])


def pinned_frame(kind: str, seed: int) -> pl.DataFrame:
    """A joined frame (`join_run(...).frame` columns): one model and task, two methods.

    kind: `paired` (pairs of a female and a male prompt, 6 samples, row labels in a(x) and
    a(c,x) with some `none`, failed scores and perplexities above the filter), `unpaired`
    (three groups, prompts without pairs, 4 samples) or `single` (one sample per prompt, so
    every view is prompt-labelled).
    """
    rng = np.random.default_rng(seed)
    groups = ["female", "male", "nonbinary"] if kind == "unpaired" else ["female", "male"]
    n_prompts, samples = {"paired": (36, 6), "unpaired": (30, 4), "single": (80, 1)}[kind]
    prompt = np.tile(np.repeat(np.arange(n_prompts), samples), 2)
    method = np.repeat(["vanilla", "lidao-min"], n_prompts * samples)
    n = prompt.size
    own = np.array(groups)[prompt % len(groups)]
    z = rng.normal(0, 0.4, n_prompts)[prompt] + rng.normal(0, 0.6, n)
    z += np.where(method == "vanilla", 0.3 * (own == "female"), 0.0)
    row_label = np.where(
        rng.random(n) < 0.1, "none", np.array(groups)[rng.integers(0, len(groups), n)]
    )
    sentiment_ok = rng.random(n) > 0.03
    return pl.DataFrame(
        {
            "model": "m",
            "method": method,
            "task": "sentiment",
            "prompt_id": [f"p{p:03d}" for p in prompt],
            "pair_id": [f"q{p // 2:03d}" for p in prompt] if kind == "paired" else [None] * n,
            "prompt_group": own,
            "label_x": row_label if kind != "single" else own,
            "label_cx": np.where(rng.random(n) < 0.7, own, row_label),
            "label_c": own,
            "sentiment": np.where(sentiment_ok, 0.5 + 0.2 * z, np.nan),
            "sentiment_status": np.where(sentiment_ok, "ok", "error"),
            "regard_label": REGARD[np.digitize(z + rng.normal(0, 0.3, n), [-0.4, 0.4, 1.2])],
            "regard_status": "ok",
            "toxicity": 1.0 / (1.0 + np.exp(2.0 - z)),
            "toxicity_status": "ok",
            "perplexity": np.where(rng.random(n) < 0.05, 900.0, 20.0),
            "perplexity_status": "ok",
        }
    )


CASES = {  # name → (frame kind, frame seed, summarize options)
    "paired": ("paired", 1, {"n_boot": 300, "n_perm": 150, "seed": 3}),
    "unpaired-3": ("unpaired", 2, {"n_boot": 200, "n_perm": 120, "seed": 5}),
    "single": ("single", 3, {"n_boot": 250, "n_perm": 100, "seed": 7}),
}


def pinned_rows(case: str) -> list[dict[str, Any]]:
    kind, seed, options = CASES[case]
    summary = summarize(pinned_frame(kind, seed), **options).summary
    rows = summary.filter(pl.col("stat").is_in(GAP_STATS)).sort(KEYS)
    return rows.select(*KEYS, "value", "ci_low", "ci_high", "p_value", "n_boot", "test").to_dicts()


def kernel_rows() -> list[dict[str, Any]]:
    """`gap_test` (p, null mean, null mean square) of every statistic under every test."""
    out = []
    frame = pinned_frame("paired", 11).filter(pl.col("method") == "lidao-min")
    prompts = sorted(set(frame["prompt_id"]))
    p = frame["prompt_id"].replace_strict({k: i for i, k in enumerate(prompts)}).to_numpy()
    unit_of = np.arange(len(prompts)) // 2
    rows = np.flatnonzero(frame["label_x"].to_numpy() != "none")
    for labels, paired in (("label_x", True), ("label_c", True), ("label_c", False)):
        g = (frame[labels].to_numpy() == "male").astype(np.int64)
        for metric in ("sentiment", "toxicity", "toxicity_cm", "regard"):
            if metric == "regard":
                v = np.digitize(frame["toxicity"].to_numpy(), [0.1, 0.2]).astype(np.float64)
            else:
                v = frame["toxicity"].to_numpy()
            gg, pp, vv = g[rows], p[rows], v[rows]
            w = bs.prompt_weights(len(prompts), 64, 9, f"{labels}|{metric}")
            gaps = bs.gap_samples(metric, gg, pp, vv, 2, w, None, 2)
            rng = bs.seeded_rng(1, f"{labels}|{paired}|{metric}")
            t = perm.gap_test(metric, gg, pp, vv, 2, float(gaps[0]), 77, rng, unit_of, paired, 2)
            out.append(
                {
                    "labels": labels,
                    "paired": paired,
                    "metric": metric,
                    "test": t.test,
                    "p_value": t.p_value,
                    "null_mean": t.null_mean,
                    "null_sq": t.null_sq,
                    "gap": float(gaps[0]),
                    "gap_sum": float(np.nansum(gaps[1:])),
                }
            )
    return out


def _golden() -> dict[str, Any]:
    return dict(json.loads(GOLDEN.read_text()))


def _close(got: Any, want: Any, key: str) -> None:
    if isinstance(want, float) and key != "p_value":
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), key
    else:
        assert got == want, key


@pytest.fixture(params=["default", "tiny"])
def chunks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The kernels with their default chunks, and with chunks of 7 resamples / labellings."""
    if request.param == "tiny":
        monkeypatch.setattr(bs, "CHUNK", 7, raising=False)
        monkeypatch.setattr(perm, "CHUNK", 7, raising=False)
    return str(request.param)


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_intervals_and_p_values_are_the_pinned_ones(case: str, chunks: str) -> None:
    want, got = _golden()["summary"][case], pinned_rows(case)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert [g[k] for k in KEYS] == [w[k] for k in KEYS]
        for key in ("value", "ci_low", "ci_high", "p_value", "n_boot", "test"):
            _close(g[key], w[key], f"{case} {[w[k] for k in KEYS]} {key}")


def test_gap_tests_are_the_pinned_ones(chunks: str) -> None:
    want, got = _golden()["kernels"], kernel_rows()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key, value in w.items():
            _close(g[key], value, f"{w['labels']} {w['paired']} {w['metric']} {key}")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    pins = {"summary": {c: pinned_rows(c) for c in sorted(CASES)}, "kernels": kernel_rows()}
    GOLDEN.write_text(json.dumps(pins, indent=0, sort_keys=True) + "\n")

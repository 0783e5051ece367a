"""Type-I error, power and coverage of the gap statistics on data with a known truth.

    PYTHONPATH=. python scripts/stats_calibration.py [--reps 400]

The simulator is `tests/calib_sim.py` (pairs with a pair and a per-prompt effect, several
samples per prompt; groups the prompt's, "prompt", or drawn per row unrelated to the score,
35% / 65%, "row"); each cell is analysed with the functions `results.stats.aggregate.summarize`
calls (`results.stats.bootstrap.gap_samples`, `results.stats.permutation.gap_test` and
`bias_corrected_tv`). Prints Markdown tables (docs/statistics.md quotes them):

1. every test's rejection rate at 0.05 with no difference (type-I) and at latent effects 0.25
   and 0.5 (power), 40 pairs x 4 samples, 100 permutations; and how often the 95% interval
   holds the truth 0 (200 resamples);
2. the count-matched EMT against the paper's EMT with unequal row labels (80 pairs x 10);
3. the plug-in and the bias-corrected TV at 175 pairs x 10 samples, at a true TV of 0 and at
   the true TVs of latent effects 0.1, 0.15 and 0.3 (computed from the normal model).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from calib_sim import analyse, simulate, true_tv  # noqa: E402

METRICS = ("sentiment", "toxicity", "toxicity_cm", "regard")
LABEL = {
    "sentiment": "sentiment mean gap",
    "toxicity": "EMT gap (paper's)",
    "toxicity_cm": "count-matched EMT gap",
    "regard": "TV distance",
}


def rates(
    metric: str, view: str, effect: float, reps: int, k: int = 2, paired: bool = True
) -> tuple[float, float]:
    """(rejection rate at 0.05, share of 95% intervals holding 0).

    Unpaired: no pair effect, and the prompts analysed as their own units.
    """
    rng = np.random.default_rng(1000)
    pair_sd = 0.5 if paired else 0.0
    outs = [
        analyse(
            simulate(rng, metric, view, effect=effect, k=k, pair_sd=pair_sd),
            metric,
            r,
            n_groups=k,
            paired=paired,
        )  # fmt: skip
        for r in range(reps)
    ]
    return (
        float(np.mean([o.p_value < 0.05 for o in outs])),
        float(np.mean([o.low <= 0.0 <= o.high for o in outs])),
    )


def time_summarize() -> None:
    """Seconds of `summarize` on 3 methods x 175 pairs x 25 samples (every metric, 4 views)."""
    import time

    import polars as pl

    from results.stats.aggregate import summarize

    rng = np.random.default_rng(0)
    n_pairs, samples = 175, 25
    prompt = np.repeat(np.arange(2 * n_pairs), samples)
    group = np.where(prompt % 2 == 0, "female", "male")
    frames = []
    for method in ("vanilla", "uddia", "lidao-min"):
        z = rng.normal(size=prompt.size)
        row_label = np.where(rng.random(prompt.size) < np.where(prompt % 2 == 0, 0.5, 0.2), "female", "male")  # fmt: skip
        frames.append(
            pl.DataFrame({
                "model": "m", "task": "toxicity", "method": method,
                "prompt_id": [f"{g}:{p // 2}" for g, p in zip(group, prompt)],
                "pair_id": [str(p // 2) for p in prompt], "prompt_group": group,
                "label_x": row_label, "label_cx": row_label, "label_c": group,
                "sentiment": 0.5 + 0.2 * z, "sentiment_status": "ok",
                "toxicity": 1 / (1 + np.exp(2 - z)), "toxicity_status": "ok",
                "regard_label": np.array(["negative", "neutral", "positive"])[np.digitize(z, [-0.5, 0.5])],
                "regard_status": "ok", "perplexity": 10.0, "perplexity_status": "ok",
            })
        )  # fmt: skip
    frame = pl.concat(frames)
    start = time.perf_counter()
    summarize(frame, None, n_boot=1000, n_perm=200)
    print(f"summarize, 3 methods x {frame.height // 3} rows: {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=400, help="replications per cell")
    parser.add_argument("--time", action="store_true", help="only time `summarize` at paper scale")
    args = parser.parse_args()
    if args.time:
        time_summarize()
        return
    reps = args.reps

    print(f"## 1. Tests ({reps} replications, 40 pairs x 4 samples)\n")
    print("| statistic | groups | test | type-I at 0.05 | power, effect 0.25 | power, 0.5 | 95% interval holds 0 (truth 0) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for view in ("prompt", "row"):
        test = "pair-swap" if view == "prompt" else "within-prompt"
        for metric in METRICS:
            type1, cover = rates(metric, view, 0.0, reps)
            p25, _ = rates(metric, view, 0.25, reps)
            p50, _ = rates(metric, view, 0.5, reps)
            hold = "— (distance ≥ 0)" if metric == "regard" else f"{cover:.3f}"
            print(f"| {LABEL[metric]} | {view} | {test} | {type1:.3f} | {p25:.3f} | {p50:.3f} | {hold} |")  # fmt: skip
    for metric in ("sentiment", "toxicity", "regard"):
        type1, cover = rates(metric, "prompt", 0.0, reps, paired=False)
        p25, _ = rates(metric, "prompt", 0.25, reps, paired=False)
        p50, _ = rates(metric, "prompt", 0.5, reps, paired=False)
        hold = "— (distance ≥ 0)" if metric == "regard" else f"{cover:.3f}"
        print(f"| {LABEL[metric]} | prompt, unpaired | prompt-shuffle | {type1:.3f} | {p25:.3f} | {p50:.3f} | {hold} |")  # fmt: skip
    type1, _ = rates("sentiment", "prompt", 0.0, reps, k=3)
    p50, _ = rates("sentiment", "prompt", 0.5, reps, k=3)
    print(f"| sentiment range, K = 3 | prompt | pair-swap (3 prompts per set) | {type1:.3f} | – | {p50:.3f} | — |")  # fmt: skip

    print(f"\n## 2. Count-matched EMT, row labels 35% / 65% unrelated to toxicity ({min(reps, 200)} replications, 80 pairs x 10 samples)\n")  # fmt: skip
    rng = np.random.default_rng(2000)
    paper, matched = [], []
    for r in range(min(reps, 200)):
        data = simulate(rng, "toxicity", "row", n_pairs=80, samples=10)
        paper.append(analyse(data, "toxicity", r, n_perm=0))
        matched.append(analyse(data, "toxicity_cm", r, n_perm=0))
    print("| statistic | mean gap × 100 (truth 0) | 95% interval holds 0 |")
    print("|---|---|---|")
    for name, outs in (("paper's EMT", paper), ("count-matched EMT", matched)):
        mean = np.mean([o.gap for o in outs])
        hold = np.mean([o.low <= 0 <= o.high for o in outs])
        print(f"| {name} | {mean:+.2f} | {hold:.3f} |")

    n_tv = min(reps, 200)
    print(f"\n## 3. TV distance at 175 pairs x 10 samples ({n_tv} replications, 100 permutations)\n")  # fmt: skip
    print("| prompt effect sd | true TV × 100 | plug-in: mean | bias-corrected: mean | bias-corrected: mean abs |")  # fmt: skip
    print("|---|---|---|---|---|")
    for prompt_sd in (0.3, 0.5):
        for effect in (0.0, 0.1, 0.15, 0.3):
            rng = np.random.default_rng(3000)
            outs = []
            for r in range(n_tv):
                data = simulate(rng, "regard", "prompt", n_pairs=175, samples=10, effect=effect, prompt_sd=prompt_sd)  # fmt: skip
                outs.append(analyse(data, "regard", r, n_boot=0, n_perm=100))
            truth = true_tv(effect, 0.5, prompt_sd)
            plug = np.mean([o.gap for o in outs])
            bc = np.mean([o.bias_corrected for o in outs])
            bc_abs = np.mean([abs(o.bias_corrected) for o in outs])
            print(f"| {prompt_sd} | {truth:.2f} | {plug:.2f} | {bc:.2f} | {bc_abs:.2f} |")


if __name__ == "__main__":
    main()

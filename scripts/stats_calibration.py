"""Type-I error, power and coverage of the gap statistics on data with a known truth.

    PYTHONPATH=. python scripts/stats_calibration.py [--reps 400]
    PYTHONPATH=. python scripts/stats_calibration.py --issue30 [--reps 300]

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

`--issue30` prints instead (docs/statistics.md quotes them):

4. type-I error with uneven rows per prompt (female prompts keep 1-2 rows, male 1-8) of every
   p-value the report prints without a mark, and how often the paper's EMT gets its mark;
5. `bias_bc` (and the earlier gated version) at true TV 0, 5, 10, 17 for 40 pairs x 1-4
   samples and 175 pairs x 10, with the coverage of its interval;
6. power at the reported MDE (each replication: a pilot, its MDE, a run with that true gap);
   `--tables b`: 6b, the paper's EMT in the row view with balanced labels (its centre near 0);
7. power at the sizes `harness power` plans from one pilot of 175 pairs x 4;
8. as 4 with rows per prompt of one mean and another spread (female 4, male 1 or 7 of 8).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from calib_sim import analyse, simulate, spread, true_tv, uneven  # noqa: E402

from results.stats import power as pw  # noqa: E402

METRICS = ("sentiment", "toxicity", "toxicity_cm", "regard")
# Table 7's cells: (metric, view, true gap × 100), gaps that need 40-120 pairs at 4 samples
PLANS = (
    ("sentiment", "prompt", 6.0), ("sentiment", "row", 5.0), ("toxicity", "prompt", 6.0),
    ("toxicity", "row", 8.0), ("toxicity_cm", "prompt", 6.0), ("toxicity_cm", "row", 4.0),
    ("regard", "prompt", 15.0), ("regard", "row", 15.0),
)  # fmt: skip
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


def effect_for(tv: float) -> float:
    """The latent effect whose true TV × 100 is `tv` (pair and prompt sd 0.5), by bisection."""
    low, high = 0.0, 3.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if true_tv(mid, 0.5, 0.5) < tv else (low, mid)
    return (low + high) / 2


def issue30(reps: int, tables: str = "45678", seed: int = 0, pilots: int = 10) -> None:
    """Tables 4-8 of the module doc (those named in `tables`); `seed` moves every table's
    stream, `pilots` is table 7's pilots per cell."""
    if "4" in tables:
        print(f"## 4. Uneven rows per prompt (female 1-2, male 1-8 of 8), 40 pairs, {reps} replications, 100 permutations\n")  # fmt: skip
        print("| statistic | view | test | type-I of every p-value at 0.05 | marked ¶ | type-I of the unmarked p-values |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for view in ("prompt", "row"):
            for metric in METRICS:
                rng = np.random.default_rng(4000 + seed)
                outs = [analyse(uneven(rng, simulate(rng, metric, view, samples=8)), metric, r, n_boot=0) for r in range(reps)]  # fmt: skip
                plain = [o for o in outs if np.isnan(o.counts_p)]
                type1 = (
                    f"{np.mean([o.p_value < 0.05 for o in plain]):.3f}"
                    if plain
                    else "– (all marked)"
                )
                every = np.mean([o.p_value < 0.05 for o in outs])
                print(f"| {LABEL[metric]} | {view} | {outs[0].test} | {every:.3f} | {1 - len(plain) / reps:.3f} | {type1} |")  # fmt: skip

    if "8" in tables:
        print(f"\n## 8. Rows per prompt of one mean, another spread (female 4, male 1 or 7 of 8), {reps} replications, 100 permutations\n")  # fmt: skip
        print("| statistic | pairs | type-I of every p-value at 0.05 | marked ¶ | type-I of the unmarked p-values |")  # fmt: skip
        print("|---|---|---|---|---|")
        for metric in ("toxicity", "toxicity_cm"):
            for n_pairs in (80, 40):
                rng = np.random.default_rng(8000 + seed)
                outs = [analyse(spread(rng, simulate(rng, metric, "prompt", n_pairs, samples=8)), metric, r, n_boot=0) for r in range(reps)]  # fmt: skip
                plain = [o for o in outs if np.isnan(o.counts_p)]
                type1 = f"{np.mean([o.p_value < 0.05 for o in plain]):.3f}" if plain else "– (all marked)"  # fmt: skip
                every = np.mean([o.p_value < 0.05 for o in outs])
                print(f"| {LABEL[metric]} | {n_pairs} | {every:.3f} | {1 - len(plain) / reps:.3f} | {type1} |", flush=True)  # fmt: skip

    if "5" in tables:
        n_bc = min(reps, 200)
        print(f"\n## 5. bias_bc, {n_bc} replications, 200 resamples, 100 permutations\n")
        print("| pairs × samples | true TV × 100 | plug-in | bias_bc | gated (before) | bias_bc 95% interval holds the truth | mean width |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for n_pairs, samples in ((40, 4), (175, 10)):
            for tv in (0.0, 5.0, 10.0, 17.0):
                rng = np.random.default_rng(5000 + seed)
                outs = []
                for r in range(n_bc):
                    data = simulate(rng, "regard", "prompt", n_pairs=n_pairs, samples=samples, effect=effect_for(tv) if tv else 0.0)  # fmt: skip
                    outs.append(
                        analyse(uneven(rng, data, 4, 4) if n_pairs == 40 else data, "regard", r)
                    )
                gated = [o.bias_corrected if o.p_value < 0.05 else 0.0 for o in outs]
                holds = np.mean([o.bc_low <= tv <= o.bc_high for o in outs])
                width = np.mean([o.bc_high - o.bc_low for o in outs])
                size = f"{n_pairs} × {'1–4' if n_pairs == 40 else samples}"
                print(f"| {size} | {tv:g} | {np.mean([o.gap for o in outs]):.2f} | {np.mean([o.bias_corrected for o in outs]):.2f} | {np.mean(gated):.2f} | {holds:.3f} | {width:.2f} |")  # fmt: skip

    if "6" in tables:
        print(f"\n## 6. Power at the reported MDE (40 pairs × 4, {reps} pilots, 400 resamples, 200 permutations)\n")  # fmt: skip
        print("| statistic | view | mean MDE × 100 | power at the MDE (asked 0.8) |")
        print("|---|---|---|---|")
        for metric in METRICS:
            for view in ("prompt", "row"):
                rng = np.random.default_rng(6000 + seed)
                hits, mdes = [], []
                for r in range(reps):
                    reported = analyse(simulate(rng, metric, view), metric, r, 400, 200)
                    data = simulate(rng, metric, view)
                    data = data._replace(value=pw.shifted(metric, data.group, data.value, reported.mde, rng))  # fmt: skip
                    hits.append(analyse(data, metric, r, n_boot=0, n_perm=200).p_value < 0.05)
                    mdes.append(reported.mde)
                print(f"| {LABEL[metric]} | {view} | {np.mean(mdes):.2f} | {np.mean(hits):.3f} |")

    if "b" in tables:  # 6b: the paper's EMT in the row view, balanced labels
        print(f"\n## 6b. The paper's EMT, row view, labels 50 % female at every prompt (40 pairs × 4, {reps} pilots)\n")  # fmt: skip
        print("| mean MDE × 100 | power at the MDE | at −MDE | at 0.75 × MDE |")
        print("|---|---|---|---|")
        rng = np.random.default_rng(6100 + seed)
        hits: dict[float, list[bool]] = {1.0: [], -1.0: [], 0.75: []}
        mdes = []
        for r in range(reps):
            reported = analyse(simulate(rng, "toxicity", "row", shares=(0.5, 0.5)), "toxicity", r, 400, 200)  # fmt: skip
            mdes.append(reported.mde)
            for scale, out in hits.items():
                data = simulate(rng, "toxicity", "row", shares=(0.5, 0.5))
                data = data._replace(value=pw.shifted("toxicity", data.group, data.value, scale * reported.mde, rng))  # fmt: skip
                out.append(analyse(data, "toxicity", r, n_boot=0, n_perm=200).p_value < 0.05)
        print(f"| {np.mean(mdes):.2f} | {np.mean(hits[1.0]):.3f} | {np.mean(hits[-1.0]):.3f} | {np.mean(hits[0.75]):.3f} |")  # fmt: skip

    if "7" in tables:
        print(f"\n## 7. Power at the planned sizes ({pilots} pilots of 175 pairs × 4 per row; {reps} simulated runs per size in the planner and at each plan)\n")  # fmt: skip
        print("| statistic | view | gap × 100 | planned pairs: median (range) | power at the plans: mean | min–max | plans within 0.8 ± 0.07 |")  # fmt: skip
        print("|---|---|---|---|---|---|---|")
        for metric, view, gap in PLANS:
            rng = np.random.default_rng(7000 + seed)
            plans, powers = [], []
            for _ in range(pilots):  # one pilot's variance is itself uncertain: over pilots
                d = simulate(rng, metric, view, n_pairs=175, samples=4)
                pilot = pw.prepare(pw.Cell(metric, d.group, d.prompt, d.value, d.unit_of, 2, True))  # fmt: skip
                got = pw.units_needed(pilot, 4, gap, 0.8, reps=reps, n_perm=100)
                assert got is not None
                hits = []
                for r in range(reps):
                    data = simulate(rng, metric, view, n_pairs=got[0])
                    data = data._replace(value=pw.shifted(metric, data.group, data.value, gap, rng))  # fmt: skip
                    hits.append(analyse(data, metric, r, n_boot=0, n_perm=100).p_value < 0.05)
                plans.append(got[0])
                powers.append(float(np.mean(hits)))
            inside = np.mean([abs(x - 0.8) <= 0.07 for x in powers])
            print(f"| {LABEL[metric]} | {view} | {gap:g} | {int(np.median(plans))} ({min(plans)}–{max(plans)}) | {np.mean(powers):.3f} | {min(powers):.2f}–{max(powers):.2f} | {inside:.0%} |", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=400, help="replications per cell")
    parser.add_argument("--time", action="store_true", help="only time `summarize` at paper scale")
    parser.add_argument("--issue30", action="store_true", help="only tables 4-7 (module doc)")
    parser.add_argument("--tables", default="45678", help="with --issue30: which of them")
    parser.add_argument("--seed", type=int, default=0, help="with --issue30: moves every stream")
    parser.add_argument("--pilots", type=int, default=10, help="with --issue30: table 7's pilots")
    args = parser.parse_args()
    if args.time:
        time_summarize()
        return
    if args.issue30:
        issue30(args.reps, args.tables, args.seed, args.pilots)
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

"""Coverage and width of the gap intervals on simulated paired data with a known gap.

    PYTHONPATH=. python scripts/stats_calibration.py

Each replication: 30 pairs (a female and a male prompt sharing a per-pair effect, sd 0.3),
2 samples per prompt, noise sd 0.1, true female − male gap `gap`; 400 resamples.
Prints, per resampling unit, how often the 95% interval holds the true gap and its mean width
(× 100), and the rejection rate of the permutation test (sentiment mean; regard TV distance).
"""

from __future__ import annotations

import numpy as np

from results import bootstrap as bs

REPS, N_BOOT, PAIRS = 200, 400, 30


def sim(rng: np.random.Generator, gap: float) -> tuple[np.ndarray, ...]:
    effect = rng.normal(0.0, 0.3, PAIRS)
    prompt = np.repeat(np.arange(2 * PAIRS), 2)
    group = prompt % 2
    value = 0.5 + effect[prompt // 2] + np.where(group == 0, gap, 0.0)
    return group, prompt, value + rng.normal(0.0, 0.1, prompt.size)


def main() -> None:
    unit_of = np.arange(2 * PAIRS) // 2
    for gap in (0.0, 0.05, 0.10):
        rng = np.random.default_rng(0)
        stats: dict[str, list[tuple[bool, float]]] = {"pair": [], "prompt": []}
        rejects = []
        for r in range(REPS):
            group, prompt, value = sim(rng, gap)
            for unit, n_u, of in (("pair", PAIRS, unit_of), ("prompt", 2 * PAIRS, None)):
                w = bs.prompt_weights(n_u, N_BOOT, r, "calibration")
                gaps = bs.gap_samples("sentiment", group, prompt, value, 2, w, of)
                ci = bs.percentile_ci(gaps[1:])
                stats[unit].append((ci.low <= 100 * gap <= ci.high, ci.high - ci.low))
            perm = bs.permuted_gaps("sentiment", group, prompt, value, 2, 400,
                                    np.random.default_rng(r), unit_of[prompt])  # fmt: skip
            full = bs.gap_samples(
                "sentiment", group, prompt, value, 2, np.ones((0, PAIRS)), unit_of
            )
            rejects.append(bs.permutation_p(float(full[0]), perm, signed=True) < 0.05)
        for unit, rows in stats.items():
            cover = np.mean([c for c, _ in rows])
            width = np.mean([w for _, w in rows])
            print(f"gap {100 * gap:4.1f}  unit {unit:6s}  coverage {cover:.3f}  width {width:5.2f}")
        print(f"gap {100 * gap:4.1f}  permutation test rejects at 0.05: {np.mean(rejects):.3f}")


if __name__ == "__main__":
    main()

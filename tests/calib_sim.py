"""Simulated counterfactual data with a known truth, for the calibration test and script.

A data set: `n_pairs` sets of `k` prompts (k = 2: a female and a male prompt; each prompt of a
set belongs to one group), `samples` generations per prompt. Every row has a latent

    z = pair effect (sd `pair_sd`) + prompt effect (sd `prompt_sd`) + noise (sd `noise_sd`),

so the prompts of a pair differ by their own effects even when the groups do not differ. The
group of a row is

- `view = "prompt"` (like a(c) and file): its prompt's group;
- `view = "row"` (like a(x), a(c,x)): drawn per row, unrelated to z: female with probability
  0.5 at a female prompt and 0.2 at a male one (35% female overall: unequal group sizes, and a
  label that depends on the prompt).

`effect` is added to z of group 0's rows (the "female" group). The metrics read z as:
sentiment 0.5 + 0.2 z (so the sentiment gap is 0.2 · effect in score units), toxicity
1 / (1 + exp(2 − z)) (EMT is the mean per-prompt max), regard the class of z among
(−∞, −0.5], (−0.5, 0.5], (0.5, ∞) (negative, neutral, positive). With `effect = 0` every
gap's true value is 0 and every test's null holds.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from results.stats import bootstrap as bs
from results.stats import emt
from results.stats import permutation as perm
from results.stats.counts import count_test


class Data(NamedTuple):
    group: np.ndarray  # (N,) group index
    prompt: np.ndarray  # (N,) prompt index
    value: np.ndarray  # (N,) the metric's value (regard: class index)
    unit_of: np.ndarray  # (P,) pair of each prompt


def simulate(
    rng: np.random.Generator,
    metric: str,
    view: str,
    n_pairs: int = 40,
    samples: int = 4,
    effect: float = 0.0,
    k: int = 2,
    pair_sd: float = 0.5,
    prompt_sd: float = 0.5,
    noise_sd: float = 0.7,
    shares: tuple[float, float] = (0.5, 0.2),
) -> Data:
    """One data set (module doc); `shares`: the chance a row is female at a female and at a
    male prompt in the row view ((0.5, 0.5): balanced labels, the paper's EMT's centre near 0)."""
    n_prompts = k * n_pairs
    prompt = np.repeat(np.arange(n_prompts), samples)
    pair = prompt // k
    z = rng.normal(0.0, pair_sd, n_pairs)[pair] + rng.normal(0.0, prompt_sd, n_prompts)[prompt]
    z = z + rng.normal(0.0, noise_sd, prompt.size)
    if view == "prompt":
        group = prompt % k
    elif view == "row":
        if k != 2:
            raise ValueError("row labels are simulated for two groups")
        share = np.where(prompt % 2 == 0, *shares)
        group = (rng.random(prompt.size) >= share).astype(np.int64)
    else:
        raise ValueError(view)
    z = z + np.where(group == 0, effect, 0.0)
    if metric == "sentiment":
        value = 0.5 + 0.2 * z
    elif metric in ("toxicity", "toxicity_cm"):
        value = 1.0 / (1.0 + np.exp(2.0 - z))
    elif metric == "regard":
        value = np.digitize(z, [-0.5, 0.5]).astype(np.float64)
    else:
        raise ValueError(metric)
    return Data(group.astype(np.int64), prompt, value, np.arange(n_prompts) // k)


def matched_m(data: Data, n_groups: int) -> int:
    """m of the count-matched EMT as `summarize` picks it (`emt.matched_rows`)."""
    n_p = data.unit_of.size
    counts = np.bincount(data.group * n_p + data.prompt, minlength=n_groups * n_p)
    return emt.matched_rows(list(counts.reshape(n_groups, n_p)))


class Outcome(NamedTuple):
    gap: float  # full-sample gap × 100
    low: float  # interval at `level`
    high: float
    p_value: float
    test: str | None
    bias_corrected: float  # TV only (NaN otherwise)
    counts_p: float  # paper's EMT marked ¶: p of the row counts by group (NaN: not marked)
    mde: float  # the minimum detectable effect (NaN without resamples)
    bc_low: float  # bias_corrected's interval (TV only)
    bc_high: float
    centre: float = float("nan")  # where the test's labellings centre the gap (`null_mean`)


def analyse(
    data: Data,
    metric: str,
    seed: int,
    n_boot: int = 200,
    n_perm: int = 100,
    level: float = 0.95,
    n_groups: int = 2,
    paired: bool = True,
) -> Outcome:
    """What `summarize` reports for one cell: gap, pair-resampled interval, test, bias-corrected TV.

    `paired=False`: analysed as unpaired prompts (each prompt its own unit).
    """
    if not paired:
        data = data._replace(unit_of=np.arange(data.unit_of.size))
    n_pairs = int(data.unit_of.max()) + 1
    weights = bs.prompt_weights(n_pairs, n_boot, seed, "calibration")
    m = matched_m(data, n_groups) if metric == "toxicity_cm" else None
    gaps = bs.gap_samples(
        metric, data.group, data.prompt, data.value, n_groups, weights, data.unit_of, m
    )
    nan = bs.Interval(np.nan, np.nan, 0)
    ci = bs.percentile_ci(gaps[1:], level) if n_boot else nan
    rng = np.random.default_rng([seed, 7])
    test = perm.gap_test(
        metric, data.group, data.prompt, data.value, n_groups, float(gaps[0]), n_perm,
        rng, data.unit_of, paired=paired, m=m, alpha=1 - level,
    )  # fmt: skip
    bc, bc_ci = np.nan, nan
    if metric == "regard":
        bc = perm.bias_corrected_tv(float(gaps[0]), test)
        if n_boot:
            bc_ci = bs.percentile_ci(perm.bias_corrected_resamples(gaps[1:], test), level)
    counts = None
    if metric == "toxicity":
        counts = count_test(data.group, data.prompt, data.value, data.unit_of, paired, n_groups, n_perm, rng)  # fmt: skip
    mde = np.nan
    if n_boot:
        mde = perm.detectable(
            metric, data.group, data.prompt, data.value, n_groups, data.unit_of, paired, m,
            weights, float(np.std(gaps[1:])), test, n_perm, np.random.default_rng([seed, 8]),
            1 - level,
        )  # fmt: skip
    return Outcome(
        float(gaps[0]), ci.low, ci.high, test.p_value, test.test, bc,
        counts[0] if counts else np.nan, mde, bc_ci.low, bc_ci.high, test.null_mean,
    )  # fmt: skip


def true_tv(effect: float, pair_sd: float, prompt_sd: float, noise_sd: float = 0.7) -> float:
    """TV × 100 between the class distributions of z + effect and z, z ~ N(0, total sd)."""
    sd = math.sqrt(pair_sd**2 + prompt_sd**2 + noise_sd**2)

    def classes(shift: float) -> list[float]:
        cdf = [0.5 * (1 + math.erf((t - shift) / (sd * math.sqrt(2)))) for t in (-0.5, 0.5)]
        return [cdf[0], cdf[1] - cdf[0], 1 - cdf[1]]

    return 50.0 * sum(abs(a - b) for a, b in zip(classes(effect), classes(0.0)))


def uneven(rng: np.random.Generator, data: Data, low: int = 2, high: int = 8) -> Data:
    """Keep 1..`low` rows of each even (female) prompt and 1..`high` of each odd one, the
    first rows of the prompt (an uneven perplexity filter or failed generations); the group
    difference in rows per prompt has nothing to do with the scores."""
    n_p = data.unit_of.size
    keep = np.where(np.arange(n_p) % 2 == 0, rng.integers(1, low + 1, n_p), rng.integers(1, high + 1, n_p))  # fmt: skip
    first = np.r_[0, np.flatnonzero(np.diff(data.prompt)) + 1]
    rank = np.arange(data.prompt.size) - first[np.cumsum(np.r_[0, np.diff(data.prompt) != 0])]
    rows = rank < keep[data.prompt]
    return Data(data.group[rows], data.prompt[rows], data.value[rows], data.unit_of)


def spread(
    rng: np.random.Generator,
    data: Data,
    female: tuple[int, ...] = (4,),
    male: tuple[int, ...] = (1, 7),
) -> Data:
    """Keep the first n rows of each prompt, n drawn from `female` at even (female) prompts and
    from `male` at odd ones: the same mean rows per prompt (4) with another spread, which the
    paper's EMT feels (E max of 4 rows is more than the mean of E max of 1 and of 7)."""
    n_p = data.unit_of.size
    keep = np.where(np.arange(n_p) % 2 == 0, rng.choice(female, n_p), rng.choice(male, n_p))
    first = np.r_[0, np.flatnonzero(np.diff(data.prompt)) + 1]
    rank = np.arange(data.prompt.size) - first[np.cumsum(np.r_[0, np.diff(data.prompt) != 0])]
    rows = rank < keep[data.prompt]
    return Data(data.group[rows], data.prompt[rows], data.value[rows], data.unit_of)

"""Seeded bootstrap of the bias gaps and paired comparisons (docs/statistics.md, "The gap").

A resample is a row of unit counts `W[b, u]` (units: pairs, else prompts); every gap is a
ratio of weighted per-unit sums, so its point estimate is the same function at `W = 1`, and the
methods of one (model, task) share `W`, which makes their comparisons (`compare_gaps`) paired.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from results.stats.emt import expected_max_cells
from results.stats.metrics import REGARD_CLASSES

CI_METHOD = "percentile"
BOOTSTRAP = "bootstrap"  # the paired comparison's test (the summary's `test` column)


def seeded_rng(seed: int, key: str) -> np.random.Generator:
    """A generator reproducible from (seed, key); `key` names the stream."""
    salt = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, salt])


CHUNK = 128  # resamples per pass: a (CHUNK, units) float64 block at a time


def prompt_weights(n_prompts: int, n_boot: int, seed: int, key: str) -> np.ndarray:
    """(n_boot, n_units) resample counts of `n_prompts` units, reproducible from (seed, key).

    `key` (e.g. "model|task") gives each block of cells its own stream, so adding a model to
    a run does not change the intervals of the others. The units may be prompts or pairs.
    Stored as uint8, one byte per (resample, unit): a unit drawn more than 255 times in one
    resample of n ≥ 256 units has probability below 1e-500. Drawn `CHUNK` resamples at a
    time, the same stream as one (n_boot, n_units) draw.
    """
    counts = np.zeros((n_boot, n_prompts), dtype=np.uint8)
    if n_prompts == 0 or n_boot == 0:
        return counts
    rng = seeded_rng(seed, key)
    for first in range(0, n_boot, CHUNK):
        draws = rng.integers(0, n_prompts, size=(min(CHUNK, n_boot - first), n_prompts))
        flat = draws + np.arange(len(draws))[:, None] * n_prompts
        block = np.bincount(flat.ravel(), minlength=draws.size)
        if block.max() > 255:
            raise OverflowError(f"a unit drawn {block.max()} times in one resample")
        counts[first : first + len(draws)] = block.reshape(draws.shape)
    return counts


def _wsum(weights: np.ndarray, per_unit: np.ndarray) -> np.ndarray:
    """(B, U) x (G, U) -> (B, G) weighted sums.

    einsum without BLAS: a threaded BLAS matmul of these thin shapes took 15-20 ms instead of
    under 1 ms while polars' thread pool was alive (2 cores), the bulk of `summarize`.
    """
    return np.einsum("bu,gu->bg", weights, per_unit, optimize=False)


def contrast(values: np.ndarray) -> np.ndarray:
    """(B, G) → (B,): g0 − g1 for two groups, max − min for more; NaN if a group is NaN."""
    if values.shape[1] < 2:
        return np.full(values.shape[0], np.nan)
    if values.shape[1] == 2:
        return np.asarray(values[:, 0] - values[:, 1])
    return np.asarray(values.max(axis=1) - values.min(axis=1))


def mean_gap(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(B,) gaps (`contrast`) between the groups' weighted means, `weights` (B, U) the
    resample counts. Mean score: `sums` (G, U) of the score over each group's rows of a unit,
    `counts` (G, U) such rows. EMT: `sums` of the largest score per prompt over group g's rows
    (prompts without any add 0), `counts` the unit's prompts where g has rows."""
    with np.errstate(invalid="ignore", divide="ignore"):
        means = _wsum(weights, sums) / _wsum(weights, counts)  # (B, G)
    return contrast(means)


def tv_distance(shares: np.ndarray) -> np.ndarray:
    """(B, G, C) class shares → (B,) largest pairwise total-variation distance."""
    n_groups = shares.shape[1]
    if n_groups < 2:
        return np.full(shares.shape[0], np.nan)
    pairs = [
        0.5 * np.abs(shares[:, i] - shares[:, j]).sum(axis=1)
        for i in range(n_groups)
        for j in range(i + 1, n_groups)
    ]
    return np.asarray(np.max(np.stack(pairs, axis=1), axis=1))


def tv_gap(weights: np.ndarray, class_counts: np.ndarray) -> np.ndarray:
    """(B,) largest total-variation distance between the groups' class distributions, in
    [0, 1], `class_counts` (G, C, U) the rows of class c in group g of unit u."""
    totals = np.einsum("bu,gcu->bgc", weights, class_counts)  # (B, G, C)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = totals / totals.sum(axis=2, keepdims=True)
    return tv_distance(shares)


class Interval(NamedTuple):
    low: float
    high: float
    n_valid: int  # resamples where the gap was defined


def percentile_ci(samples: np.ndarray, level: float = 0.95) -> Interval:
    """Percentile interval of the defined (non-NaN) resamples; NaN bounds if none."""
    valid = samples[~np.isnan(samples)]
    if valid.size == 0:
        return Interval(float("nan"), float("nan"), 0)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(valid, [tail, 100.0 - tail])
    return Interval(float(low), float(high), int(valid.size))


def is_signed(metric: str, n_groups: int) -> bool:
    """Whether the cell's gap is a signed difference (its interval may contain 0)."""
    return metric != "regard" and n_groups == 2


class Comparison(NamedTuple):
    """Paired comparison of two gaps: `diff` = |gap A| − |gap B| over the same resamples."""

    diff: float
    low: float
    high: float
    p_value: float  # two-sided; 1.0 when every resample ties
    n_valid: int


def compare_gaps(
    a: np.ndarray, b: np.ndarray, level: float = 0.95, point: tuple[float, float] | None = None
) -> Comparison:
    """Paired bootstrap comparison of two cells' gaps (resampled with the same weights).

    Compares magnitudes: d* = |a*| − |b*| per resample (a signed gap's size is its bias).
    Interval: percentile interval of d*. p-value: 2 · min(P(d* ≤ 0), P(d* ≥ 0)), capped at 1;
    resamples where d* = 0 (ties) count on both sides, so identical methods give p = 1.

    Args:
        a, b: (B,) gaps of the two cells at the same resamples (NaN: undefined, left out).
        point: the two full-sample gaps, for `diff` (default: the median of d*).
    """
    ok = ~(np.isnan(a) | np.isnan(b))
    n = int(ok.sum())
    if n == 0:
        return Comparison(float("nan"), float("nan"), float("nan"), float("nan"), 0)
    d = np.abs(a[ok]) - np.abs(b[ok])
    # Differences of resamples of the same data: round off float noise before the sign test.
    scale = max(float(np.max(np.abs(a[ok]))), float(np.max(np.abs(b[ok]))), 1.0)
    d = np.where(np.abs(d) <= 1e-12 * scale, 0.0, d)
    ci = percentile_ci(d, level)
    p = min(1.0, 2.0 * min(float(np.mean(d <= 0)), float(np.mean(d >= 0))))
    diff = abs(point[0]) - abs(point[1]) if point is not None else float(np.median(d))
    return Comparison(float(diff), ci.low, ci.high, p, n)


def unit_arrays(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    unit_of: np.ndarray,
    m: int | None = None,
) -> tuple[np.ndarray, ...]:
    """Per-(group, unit) sums of the cell's rows, the input of the weighted statistics: regard
    ((G, C, U) class counts,), else the numerators and denominators of `mean_gap`."""
    n_p, n_u = unit_of.size, int(unit_of.max()) + 1 if unit_of.size else 0
    cell = group * n_p + prompt
    if metric == "regard":
        n_c = len(REGARD_CLASSES)
        flat = (group * n_c + value.astype(np.int64)) * n_u + unit_of[prompt]
        counts = np.bincount(flat, minlength=n_groups * n_c * n_u).astype(np.float64)
        return (counts.reshape(n_groups, n_c, n_u),)
    counts = np.bincount(cell, minlength=n_groups * n_p).astype(np.float64).reshape(n_groups, n_p)
    to_unit = np.arange(n_groups)[:, None] * n_u + unit_of[None, :]  # (G, P) → flat (g, unit)
    size = n_groups * n_u

    def by_unit(per_prompt: np.ndarray) -> np.ndarray:
        return np.bincount(to_unit.ravel(), weights=per_prompt.ravel(), minlength=size).reshape(
            n_groups, n_u
        )

    if metric == "toxicity_cm":
        if m is None:
            raise ValueError("toxicity_cm needs m (rows per prompt and group)")
        em, eligible = expected_max_cells(group[None, :], prompt, value, n_groups, n_p, m)
        return by_unit(em[0]), by_unit(eligible[0].astype(np.float64))
    if metric == "toxicity":
        top = np.full(n_groups * n_p, -np.inf)
        np.maximum.at(top, cell, value)
        present = (counts > 0).astype(np.float64)
        filled = np.where(present > 0, top.reshape(n_groups, n_p), 0.0)
        return by_unit(filled), by_unit(present)
    sums = np.bincount(cell, weights=value, minlength=n_groups * n_p).reshape(n_groups, n_p)
    return by_unit(sums), by_unit(counts)


def gap_samples(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    weights: np.ndarray,
    unit_of: np.ndarray | None = None,
    m: int | None = None,
) -> np.ndarray:
    """The bias gap × 100 of one cell: at the full sample, then at each resample.

    Args:
        metric: sentiment (mean gap), regard (TV distance), toxicity (EMT gap) or toxicity_cm
            (count-matched EMT gap, `m` rows per prompt and group); any other per-row score
            is treated like sentiment.
        group: (N,) group index of each scored row, in [0, n_groups).
        prompt: (N,) index of each row's prompt, in [0, P).
        value: (N,) the score (finite); for regard the class index into REGARD_CLASSES (rows
            of class `other` left out by the caller).
        n_groups: number of demographic groups.
        weights: (B, U) resample counts of the units, shared by every cell of a (model, task).
        unit_of: (P,) unit (pair) of each prompt; default: each prompt its own unit (U = P).

    Returns:
        (1 + B,) gaps; NaN where a group has no rows.
    """
    if unit_of is None:
        unit_of = np.arange(weights.shape[1])
    arrays = unit_arrays(metric, group, prompt, value, n_groups, unit_of, m)
    return 100.0 * resampled(tv_gap if metric == "regard" else mean_gap, weights, *arrays)


def resampled(gap: Callable[..., np.ndarray], weights: np.ndarray, *arrays: np.ndarray) -> np.ndarray:  # fmt: skip
    """(1 + B,) `gap(W, *arrays)` at the full sample (W = 1), then at each resample of
    `weights` (B, U), `CHUNK` resamples at a time."""
    parts = [gap(np.ones((1, weights.shape[1])), *arrays)]
    for first in range(0, weights.shape[0], CHUNK):
        parts.append(gap(weights[first : first + CHUNK].astype(np.float64), *arrays))
    return np.concatenate(parts)

"""Seeded bootstrap over prompts for the bias gaps.

The unit of resampling is the prompt (its generations move together). One resample is a row
of counts `W[b, p]` (how often prompt p was drawn); every gap is a ratio of weighted per-prompt
sums, so a gap's point estimate is the same function at `W = 1`, and all methods of one
(model, task) share the same `W`: paired comparisons use the same resamples.

Gaps for K ≥ 2 groups are the largest pairwise gap; a group without data makes the gap NaN
(undefined), never 0.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from results.metrics import REGARD_CLASSES


def prompt_weights(n_prompts: int, n_boot: int, seed: int, key: str) -> np.ndarray:
    """(n_boot, n_prompts) resample counts, reproducible from (seed, key).

    `key` (e.g. "model|task") gives each block of cells its own stream, so adding a model to
    a run does not change the intervals of the others.
    """
    if n_prompts == 0 or n_boot == 0:
        return np.zeros((n_boot, n_prompts))
    salt = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    rng = np.random.default_rng([seed, salt])
    draws = rng.integers(0, n_prompts, size=(n_boot, n_prompts))
    flat = draws + np.arange(n_boot)[:, None] * n_prompts
    counts = np.bincount(flat.ravel(), minlength=n_boot * n_prompts)
    return counts.reshape(n_boot, n_prompts).astype(np.float64)


def _wsum(weights: np.ndarray, per_prompt: np.ndarray) -> np.ndarray:
    """(B, P) x (G, P) -> (B, G) weighted sums.

    einsum without BLAS: a threaded BLAS matmul of these thin shapes took 15-20 ms instead of
    under 1 ms while polars' thread pool was alive (2 cores), the bulk of `summarize`.
    """
    return np.einsum("bp,gp->bg", weights, per_prompt, optimize=False)


def _spread(values: np.ndarray) -> np.ndarray:
    """(B, G) → (B,): max − min over groups (the largest pairwise gap), NaN if any is NaN."""
    if values.shape[1] < 2:
        return np.full(values.shape[0], np.nan)
    return np.asarray(values.max(axis=1) - values.min(axis=1))


def mean_gap(weights: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Largest gap between group means.

    Args:
        weights: (B, P) resample counts.
        sums: (G, P) sum of the score over each group's rows of each prompt.
        counts: (G, P) number of such rows.

    Returns:
        (B,) gaps, in the score's units.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        means = _wsum(weights, sums) / _wsum(weights, counts)  # (B, G)
    return _spread(means)


def tv_gap(weights: np.ndarray, class_counts: np.ndarray) -> np.ndarray:
    """Largest total-variation distance between the groups' class distributions.

    Args:
        weights: (B, P) resample counts.
        class_counts: (G, C, P) rows of class c in group g for prompt p.

    Returns:
        (B,) distances in [0, 1].
    """
    totals = np.einsum("bp,gcp->bgc", weights, class_counts)  # (B, G, C)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = totals / totals.sum(axis=2, keepdims=True)
    n_groups = shares.shape[1]
    if n_groups < 2:
        return np.full(weights.shape[0], np.nan)
    pairs = [
        0.5 * np.abs(shares[:, i] - shares[:, j]).sum(axis=1)
        for i in range(n_groups)
        for j in range(i + 1, n_groups)
    ]
    return np.asarray(np.max(np.stack(pairs, axis=1), axis=1))


def max_mean_gap(weights: np.ndarray, maxima: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Largest gap of expected maximum (e.g. toxicity) between groups.

    Args:
        weights: (B, P) resample counts.
        maxima: (G, P) the largest score among group g's rows of prompt p (any value if absent).
        present: (G, P) 1 where group g has rows for prompt p, else 0.

    Returns:
        (B,) gaps of the per-group means over prompts of the per-prompt maxima.
    """
    filled = np.where(present > 0, maxima, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        emt = _wsum(weights, filled) / _wsum(weights, present)  # (B, G)
    return _spread(emt)


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


def share_smaller(method: np.ndarray, reference: np.ndarray) -> tuple[float, int]:
    """Share of paired resamples where `method`'s gap is strictly smaller than `reference`'s.

    Ties (e.g. identical generations) count as not smaller. Resamples where either gap is
    undefined are left out; the second value is how many remained.
    """
    ok = ~(np.isnan(method) | np.isnan(reference))
    n = int(ok.sum())
    if n == 0:
        return float("nan"), 0
    return float(np.mean(method[ok] < reference[ok])), n


def gap_samples(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    weights: np.ndarray,
) -> np.ndarray:
    """The bias gap × 100 of one cell: at the full sample, then at each resample.

    Args:
        metric: sentiment (mean gap), regard (TV distance) or toxicity (EMT gap); any other
            per-row score is treated like sentiment.
        group: (N,) group index of each scored row, in [0, n_groups).
        prompt: (N,) column of each row's prompt in `weights`.
        value: (N,) the score; for regard the class index into REGARD_CLASSES (rows of
            class `other` left out by the caller).
        n_groups: number of demographic groups.
        weights: (B, P) resample counts shared by every cell of the same (model, task).

    Returns:
        (1 + B,) gaps; NaN where a group has no rows.
    """
    n_p = weights.shape[1]
    full = np.vstack([np.ones((1, n_p)), weights])
    cell = group * n_p + prompt
    if metric == "regard":
        n_c = len(REGARD_CLASSES)
        flat = (group * n_c + value.astype(np.int64)) * n_p + prompt
        counts = np.bincount(flat, minlength=n_groups * n_c * n_p).astype(np.float64)
        return 100.0 * tv_gap(full, counts.reshape(n_groups, n_c, n_p))
    counts = np.bincount(cell, minlength=n_groups * n_p).astype(np.float64).reshape(n_groups, n_p)
    if metric == "toxicity":
        top = np.full(n_groups * n_p, -np.inf)
        np.maximum.at(top, cell, value)
        present = (counts > 0).astype(np.float64)
        return 100.0 * max_mean_gap(full, top.reshape(n_groups, n_p), present)
    sums = np.bincount(cell, weights=value, minlength=n_groups * n_p).reshape(n_groups, n_p)
    return 100.0 * mean_gap(full, sums, counts)

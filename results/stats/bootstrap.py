"""Seeded bootstrap and permutation tests for the bias gaps (docs/statistics.md).

Resampling unit: the *pair* (`pair_id`) when the prompts come as counterfactual pairs, else the
prompt; a unit's generations move together. One resample is a row of counts `W[b, u]` (how
often unit u was drawn); every gap is a ratio of weighted per-unit sums, so its point estimate is
the same function at `W = 1`, and all methods of one (model, task) share the same `W`: paired
comparisons use the same resamples.

The gap statistic of a cell:
- K = 2 groups (g0, g1 in the configured order), mean score and EMT: the *signed* difference
  g0 − g1, so its percentile interval contains 0 when the groups do not differ;
- K ≥ 3 groups, mean score and EMT: the range max − min over groups (non-negative);
- regard: total-variation distance between the groups' class distributions (the largest
  pairwise one for K ≥ 3; non-negative).
Non-negative statistics are biased upwards near 0 (the plug-in of a distance), so their interval
never reaches 0. Every gap carries a permutation p-value of "no difference between groups"
(`gap_test`): where every prompt's rows carry one group (views a(c), file) whole prompts
exchange groups within their pair (`pair-swap`; over all prompts when unpaired); where the
label is the row's (a(x), a(c,x)) row labels are shuffled within each prompt
(`within-prompt`). Also here: the count-matched EMT (`expected_max_cells`, exact expected
maximum of m rows per prompt and group) and the bias-corrected TV (`bias_corrected_tv`).
A group without data makes the gap NaN (undefined), never 0.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np

from results.stats.metrics import REGARD_CLASSES

CI_METHOD = "percentile"


def _rng(seed: int, key: str) -> np.random.Generator:
    salt = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return np.random.default_rng([seed, salt])


def prompt_weights(n_prompts: int, n_boot: int, seed: int, key: str) -> np.ndarray:
    """(n_boot, n_units) resample counts of `n_prompts` units, reproducible from (seed, key).

    `key` (e.g. "model|task") gives each block of cells its own stream, so adding a model to
    a run does not change the intervals of the others. The units may be prompts or pairs.
    """
    if n_prompts == 0 or n_boot == 0:
        return np.zeros((n_boot, n_prompts))
    rng = _rng(seed, key)
    draws = rng.integers(0, n_prompts, size=(n_boot, n_prompts))
    flat = draws + np.arange(n_boot)[:, None] * n_prompts
    counts = np.bincount(flat.ravel(), minlength=n_boot * n_prompts)
    return counts.reshape(n_boot, n_prompts).astype(np.float64)


unit_weights = prompt_weights


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
    """Gap (`contrast`) between group means.

    Args:
        weights: (B, U) resample counts.
        sums: (G, U) sum of the score over each group's rows of each unit.
        counts: (G, U) number of such rows.

    Returns:
        (B,) gaps, in the score's units.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        means = _wsum(weights, sums) / _wsum(weights, counts)  # (B, G)
    return contrast(means)


def _tv(shares: np.ndarray) -> np.ndarray:
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
    """Largest total-variation distance between the groups' class distributions.

    Args:
        weights: (B, U) resample counts.
        class_counts: (G, C, U) rows of class c in group g for unit u.

    Returns:
        (B,) distances in [0, 1].
    """
    totals = np.einsum("bu,gcu->bgc", weights, class_counts)  # (B, G, C)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = totals / totals.sum(axis=2, keepdims=True)
    return _tv(shares)


def max_mean_gap(weights: np.ndarray, maxima: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Gap (`contrast`) of expected maximum (e.g. toxicity) between groups.

    Args:
        weights: (B, U) resample counts.
        maxima: (G, U) sum over the unit's prompts of the largest score among group g's rows of
            that prompt (prompts where g has no row add 0).
        present: (G, U) number of the unit's prompts where group g has rows.

    Returns:
        (B,) gaps of the per-group means over prompts of the per-prompt maxima.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        emt = _wsum(weights, maxima) / _wsum(weights, present)  # (B, G)
    return contrast(emt)


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


def _unit_arrays(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    unit_of: np.ndarray,
    m: int | None = None,
) -> tuple[np.ndarray, ...]:
    """Per-(group, unit) sums of the cell's rows, the input of the weighted statistics."""
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
    n_u = weights.shape[1]
    if unit_of is None:
        unit_of = np.arange(n_u)
    full = np.vstack([np.ones((1, n_u)), weights])
    arrays = _unit_arrays(metric, group, prompt, value, n_groups, unit_of, m)
    if metric == "regard":
        return 100.0 * tv_gap(full, arrays[0])
    if metric in ("toxicity", "toxicity_cm"):
        return 100.0 * max_mean_gap(full, *arrays)
    return 100.0 * mean_gap(full, *arrays)


# --- Count-matched EMT ---------------------------------------------------------------------


def _log_factorials(n: int) -> np.ndarray:
    """log k! for k = 0..n."""
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


def _ranked(
    labels: np.ndarray, prompt: np.ndarray, value: np.ndarray, n_groups: int, n_p: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by (prompt, value): flat (r, g, p) cell of each, its 1-based rank by value
    within the cell, the cells' row counts (flat, R·G·P) and the sorted values."""
    n_r = labels.shape[0]
    order = np.lexsort((value, prompt))  # by prompt, then ascending value
    lab, pp, vv = labels[:, order], prompt[order], value[order]
    cell = (np.arange(n_r)[:, None] * n_groups + lab) * n_p + pp[None, :]
    counts = np.bincount(cell.ravel(), minlength=n_r * n_groups * n_p)
    new = np.r_[True, pp[1:] != pp[:-1]]
    starts, seg = np.flatnonzero(new), np.cumsum(new) - 1
    rank = np.zeros(lab.shape, dtype=np.int64)
    for g in range(n_groups):
        ind = lab == g
        cs = np.cumsum(ind, axis=1)
        before = np.where(starts > 0, cs[:, np.maximum(starts - 1, 0)], 0)  # (R, prompts)
        rank = np.where(ind, cs - before[:, seg], rank)
    return cell, rank, counts, vv


def expected_max_cells(
    labels: np.ndarray, prompt: np.ndarray, value: np.ndarray, n_groups: int, n_p: int, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """E[max of m rows drawn without replacement] per (labelling, group, prompt), exactly.

    With a cell's n values sorted ascending x_(1) ≤ … ≤ x_(n), the maximum of m of them drawn
    without replacement is x_(i) with probability C(i − 1, m − 1) / C(n, m) (i ≥ m), so the
    expectation is that weighted sum: no sampling.

    Args:
        labels: (R, N) group of each row under R labellings (the observed one: R = 1).
        prompt: (N,) prompt index of each row, in [0, n_p).
        value: (N,) finite scores.
        m: rows drawn per (prompt, group).

    Returns:
        (R, G, P) expected maxima (0 where the cell has fewer than m rows) and (R, G, P)
        eligibility (the cell has at least m rows).
    """
    n_r, n = labels.shape
    shape = (n_r, n_groups, n_p)
    if n == 0 or n_p == 0:
        return np.zeros(shape), np.zeros(shape, dtype=bool)
    cell, rank, counts, vv = _ranked(labels, prompt, value, n_groups, n_p)
    n_cell = counts[cell]
    ok = (rank >= m) & (n_cell >= m)
    lf = _log_factorials(int(n_cell.max()))
    r_, n_ = np.where(ok, rank, m), np.where(ok, n_cell, m)
    log_w = (lf[r_ - 1] - lf[m - 1] - lf[r_ - m]) - (lf[n_] - lf[m] - lf[n_ - m])
    w = np.where(ok, np.exp(log_w), 0.0)
    sums = np.bincount(cell.ravel(), weights=(w * vv[None, :]).ravel(), minlength=counts.size)
    return sums.reshape(shape), (counts >= m).reshape(shape)


def matched_rows(counts: list[np.ndarray]) -> int:
    """m of the count-matched EMT: the smallest lower quartile, over the given arrays, of
    the non-zero per-(prompt, group) row counts (at least 1).

    Args:
        counts: one array per (view, group) of the row counts of the (method, prompt) cells.
    """
    quartiles = [int(np.quantile(c[c > 0], 0.25, method="lower")) for c in counts if np.any(c > 0)]
    return max(1, min(quartiles)) if quartiles else 1


# --- Tests of "no difference between the groups" ------------------------------------------


def _permuted_labels(
    group: np.ndarray, strata: np.ndarray | None, n_perm: int, rng: np.random.Generator
) -> np.ndarray:
    """(n_perm, N) copies of `group` shuffled within each stratum (all entries when None)."""
    n = group.size
    keys = rng.random((n_perm, n))
    if strata is not None:
        order = np.argsort(strata, kind="stable")
        # Sorted by stratum, a key offset by the stratum keeps each entry inside its block.
        perm = np.argsort(keys[:, order] + strata[order][None, :].astype(np.float64), axis=1)
        shuffled = np.empty((n_perm, n), dtype=group.dtype)
        shuffled[:, order] = group[order][perm]
        return shuffled
    return np.asarray(group[np.argsort(keys, axis=1)])


def label_gaps(
    metric: str,
    labels: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    m: int | None = None,
) -> np.ndarray:
    """(R,) gaps × 100 of the rows under R labellings `labels` (R, N), full sample.

    `metric`: sentiment (or any per-row score), regard (TV), toxicity (EMT gap) or
    toxicity_cm (count-matched EMT gap over `m` rows per prompt and group).
    """
    n_perm = labels.shape[0]
    base = np.arange(n_perm)[:, None]
    n_p = int(prompt.max()) + 1 if prompt.size else 0
    if metric == "regard":
        n_c = len(REGARD_CLASSES)
        flat = (base * n_groups + labels) * n_c + value.astype(np.int64)[None, :]
        counts = np.bincount(flat.ravel(), minlength=n_perm * n_groups * n_c).astype(np.float64)
        counts = counts.reshape(n_perm, n_groups, n_c)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares = counts / counts.sum(axis=2, keepdims=True)
        return 100.0 * _tv(shares)
    if metric == "toxicity_cm":
        if m is None:
            raise ValueError("toxicity_cm needs m (rows per prompt and group)")
        sums, eligible = expected_max_cells(labels, prompt, value, n_groups, n_p, m)
        with np.errstate(invalid="ignore", divide="ignore"):
            emt = sums.sum(axis=2) / eligible.sum(axis=2)
        return 100.0 * contrast(emt)
    if metric == "toxicity":
        if labels.shape[1] == 0:
            return np.full(n_perm, np.nan)
        cell, rank, counts, vv = _ranked(labels, prompt, value, n_groups, n_p)
        top = np.where(rank == counts[cell], vv[None, :], 0.0)  # each cell's largest row
        sums = np.bincount(cell.ravel(), weights=top.ravel(), minlength=counts.size)
        present = (counts > 0).reshape(n_perm, n_groups, n_p).sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            emt = sums.reshape(n_perm, n_groups, n_p).sum(axis=2) / present
        return 100.0 * contrast(emt)
    flat = (base * n_groups + labels).ravel()
    size = n_perm * n_groups
    sums = np.bincount(flat, weights=np.broadcast_to(value, labels.shape).ravel(), minlength=size)
    counts = np.bincount(flat, minlength=size).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (sums / counts).reshape(n_perm, n_groups)
    return 100.0 * contrast(means)


def permuted_gaps(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    n_perm: int,
    rng: np.random.Generator,
    strata: np.ndarray | None = None,
    m: int | None = None,
) -> np.ndarray:
    """(n_perm,) gaps × 100 with the rows' group labels shuffled within `strata` (rows)."""
    labels = _permuted_labels(group, strata, n_perm, rng)
    return label_gaps(metric, labels, prompt, value, n_groups, m)


def permutation_p(observed: float, permuted: np.ndarray, signed: bool) -> float:
    """(1 + #{|T*| ≥ |T|}) / (1 + R); one-sided on T for non-negative statistics.

    Permutations where the gap is undefined (a group emptied) are left out; NaN if none remain
    or the observed gap is undefined.
    """
    valid = permuted[~np.isnan(permuted)]
    if not np.isfinite(observed) or valid.size == 0:
        return float("nan")
    t, s = (abs(observed), np.abs(valid)) if signed else (observed, valid)
    tol = 1e-9 * max(1.0, abs(t))  # the same split computed in another order
    return float((1 + np.sum(s >= t - tol)) / (1 + valid.size))


def prompt_labelled(group: np.ndarray, prompt: np.ndarray) -> bool:
    """Whether every prompt's rows carry one group (the group is the prompt's, not the row's)."""
    if group.size == 0:
        return True
    label = np.zeros(int(prompt.max()) + 1, dtype=group.dtype)
    label[prompt] = group
    return bool(np.all(label[prompt] == group))


# Names of the tests (the summary's `test` column).
PAIR_SWAP = "pair-swap"
PROMPT_SHUFFLE = "prompt-shuffle"
WITHIN_PROMPT = "within-prompt"
BOOTSTRAP = "bootstrap"


def null_labels(
    group: np.ndarray,
    prompt: np.ndarray,
    unit_of: np.ndarray,
    paired: bool,
    n_perm: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, str]:
    """(n_perm, N) row labels under "no difference between the groups", and the test's name.

    - Every prompt's rows in one group (views a(c) and file, or one sample per prompt): the
      labels are the prompts'. Paired data: the prompts of each pair exchange their labels
      (a random permutation within the pair, for two prompts a swap with probability 1/2);
      unpaired: the prompt labels are permuted over all prompts. A prompt keeps all its rows.
    - Otherwise (a(x), a(c,x): the label is the row's): the row labels are shuffled within each
      prompt, so each prompt keeps its rows and its number of rows per group.
    """
    if prompt_labelled(group, prompt):
        used = np.unique(prompt)
        label = np.zeros(int(prompt.max()) + 1 if prompt.size else 0, dtype=group.dtype)
        label[prompt] = group
        strata = unit_of[used] if paired else None
        perm = _permuted_labels(label[used], strata, n_perm, rng)
        return perm[:, np.searchsorted(used, prompt)], PAIR_SWAP if paired else PROMPT_SHUFFLE
    return _permuted_labels(group, prompt, n_perm, rng), WITHIN_PROMPT


def _prompt_parts(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    used: np.ndarray,
    m: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per used prompt (all its rows in one group): what it adds to its group's numerator
    ((P', C) class counts for regard, else (P',)) and denominator (P',)."""
    n_p = int(prompt.max()) + 1
    counts = np.bincount(prompt, minlength=n_p).astype(np.float64)[used]
    if metric == "regard":
        n_c = len(REGARD_CLASSES)
        flat = prompt * n_c + value.astype(np.int64)
        classes = np.bincount(flat, minlength=n_p * n_c).reshape(n_p, n_c)[used]
        return classes.astype(np.float64), counts
    if metric in ("toxicity", "toxicity_cm"):
        rows = np.zeros((1, prompt.size), dtype=np.int64)  # one group: the prompt's own rows
        if metric == "toxicity_cm":
            if m is None:
                raise ValueError("toxicity_cm needs m (rows per prompt and group)")
            em, eligible = expected_max_cells(rows, prompt, value, 1, n_p, m)
            return em[0, 0, used], eligible[0, 0, used].astype(np.float64)
        top = np.full(n_p, -np.inf)
        np.maximum.at(top, prompt, value)
        return top[used], np.ones(used.size)
    sums = np.bincount(prompt, weights=value, minlength=n_p)[used]
    return sums, counts


def _prompt_label_gaps(
    metric: str, labels: np.ndarray, num: np.ndarray, den: np.ndarray, n_groups: int
) -> np.ndarray:
    """(R,) gaps × 100 with the used prompts' labels `labels` (R, P') and their parts."""
    n_r, n_u = labels.shape
    flat = (np.arange(n_r)[:, None] * n_groups + labels).ravel()
    size = n_r * n_groups
    if metric == "regard":
        n_c = num.shape[1]
        cells = (flat[:, None] * n_c + np.arange(n_c)[None, :]).ravel()
        weights = np.broadcast_to(num[None], (n_r, n_u, n_c)).ravel()
        totals = np.bincount(cells, weights=weights, minlength=size * n_c)
        totals = totals.reshape(n_r, n_groups, n_c)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares = totals / totals.sum(axis=2, keepdims=True)
        return 100.0 * _tv(shares)
    top = np.bincount(flat, weights=np.broadcast_to(num, labels.shape).ravel(), minlength=size)
    bottom = np.bincount(flat, weights=np.broadcast_to(den, labels.shape).ravel(), minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * contrast((top / bottom).reshape(n_r, n_groups))


def _few_swaps(label: np.ndarray, pair: np.ndarray, below: int = 8) -> str | None:
    """A note when fewer than `below` pairs hold prompts of two groups: the swap then has at
    most 2^k distinct labellings (k such pairs) and p cannot go below about 2 / 2^k."""
    n_pairs = int(pair.max()) + 1 if pair.size else 0
    lo = np.full(n_pairs, np.iinfo(np.int64).max)
    hi = np.full(n_pairs, -1)
    np.minimum.at(lo, pair, label.astype(np.int64))
    np.maximum.at(hi, pair, label.astype(np.int64))
    k = int(np.sum((hi >= 0) & (lo != hi)))
    if 0 < k < below:
        return (
            f"only {k} pair(s) hold prompts of two groups: the swap has at most {2**k} "
            f"labellings, so p cannot go below about {min(1.0, 2 / 2**k):.2g}"
        )
    return None


class GapTest(NamedTuple):
    p_value: float  # NaN: no test
    test: str | None  # PAIR_SWAP, PROMPT_SHUFFLE or WITHIN_PROMPT
    null_mean: float  # mean gap over the labellings of the null (the plug-in's value at 0)
    note: str | None
    null_sq: float = float("nan")  # mean squared gap over the null's labellings


def gap_test(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    observed: float,
    n_perm: int,
    rng: np.random.Generator,
    unit_of: np.ndarray,
    paired: bool,
    m: int | None = None,
) -> GapTest:
    """Permutation test of one cell's gap (see `null_labels` for which labels move).

    p = (1 + #{|T*| ≥ |T|}) / (1 + R), two-sided for signed gaps, one-sided on the distance for
    TV and K ≥ 3 ranges.
    """
    if n_perm == 0 or not np.isfinite(observed) or group.size == 0:
        return GapTest(float("nan"), None, float("nan"), None, float("nan"))
    if prompt_labelled(group, prompt):  # move whole prompts: per-prompt parts, then labels
        used = np.unique(prompt)
        label = np.zeros(int(prompt.max()) + 1, dtype=group.dtype)
        label[prompt] = group
        strata = unit_of[used] if paired else None
        labels = _permuted_labels(label[used], strata, n_perm, rng)
        num, den = _prompt_parts(metric, group, prompt, value, n_groups, used, m)
        perm = _prompt_label_gaps(metric, labels, num, den, n_groups)
        test, moved = PAIR_SWAP if paired else PROMPT_SHUFFLE, bool(np.any(labels != label[used]))
        few = _few_swaps(label[used], unit_of[used]) if paired else None
    else:
        labels = _permuted_labels(group, prompt, n_perm, rng)
        perm = label_gaps(metric, labels, prompt, value, n_groups, m)
        test, moved, few = WITHIN_PROMPT, True, None
    p = permutation_p(observed, perm, is_signed(metric, n_groups))
    valid = perm[~np.isnan(perm)]
    null_mean = float(valid.mean()) if valid.size else float("nan")
    null_sq = float(np.mean(valid**2)) if valid.size else float("nan")
    note = None
    if few:
        note = few
    if not moved:
        note = (
            "no pair holds prompts of two groups: the label swap cannot move a label (p = 1)"
            if test == PAIR_SWAP
            else "the permutation cannot move a label (p = 1)"
        )
    return GapTest(p, test, null_mean, note, null_sq)


def bias_corrected_tv(observed: float, test: GapTest, alpha: float) -> float:
    """The TV distance with its sampling bias taken out (docs/statistics.md).

    sqrt(max(0, T² − E₀[T*²])) where the test rejects at `alpha`, 0 where it does not: the
    plug-in's square exceeds the true square by about its second moment under the null (the
    labellings of the test), and a distance the test cannot tell from 0 is reported as 0.
    """
    if not (np.isfinite(observed) and np.isfinite(test.null_sq) and np.isfinite(test.p_value)):
        return float("nan")
    if test.p_value >= alpha:
        return 0.0
    return float(np.sqrt(max(0.0, observed**2 - test.null_sq)))

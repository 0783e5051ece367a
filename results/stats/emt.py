"""The paper's EMT and the count-matched one (docs/statistics.md, "Count-matched EMT"): the
exact expected maximum of `m` rows drawn per (prompt, group), which the paper's maximum over
all of a group's rows is not (it grows with their number); `matched_rows` picks `m`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Runs(NamedTuple):
    """Rows sorted by (prompt, value) as runs of one prompt each (`prompt_runs`)."""

    starts: np.ndarray  # (P',) first row of each run
    lengths: np.ndarray  # (P',) its rows
    top: int  # rows of the longest run


def prompt_runs(prompt: np.ndarray) -> Runs:
    """The runs of equal `prompt` (sorted) in row order."""
    starts = np.flatnonzero(np.r_[True, prompt[1:] != prompt[:-1]]) if prompt.size else prompt
    lengths = np.diff(np.r_[starts, prompt.size])
    return Runs(starts, lengths, int(lengths.max(initial=0)))


def labelled_emts(
    labels: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    m: int | None = None,
    runs: Runs | None = None,
) -> np.ndarray:
    """(R, G) EMT of each group under R labellings (R, N) of the rows.

    `m` None: the paper's EMT; else the count-matched EMT over `m` rows. Time and memory grow
    with R·N only (no (R, G, prompts) cells); `runs`: the rows are sorted by (prompt, value)
    and these are their `prompt_runs` (computed once for many labellings). NaN where a group
    has no prompt to count.
    """
    if runs is None:
        step, rise = np.diff(prompt), np.diff(value)
        if not np.all((step > 0) | ((step == 0) & (rise >= 0))):  # by prompt, then value
            order = np.lexsort((value, prompt))
            labels, prompt, value = labels[:, order], prompt[order], value[order]
        runs = prompt_runs(prompt)
    n_r, n = labels.shape
    out = np.full((n_r, n_groups), np.nan)
    if n == 0:
        return out
    starts = runs.starts
    table = max_weights(runs.top, m).ravel() if m else np.zeros(1)
    for g in range(n_groups):
        mine = labels == g
        if m is None:  # each cell's largest row is its last
            last = np.maximum.reduceat(np.where(mine, np.arange(n), -1), starts, axis=1)
            has = last >= starts  # (R, prompts): the group has rows there
            total, used = np.where(has, value[last], 0.0).sum(axis=1), has.sum(axis=1)
        else:
            w, count = _matched(mine, value, runs, table)
            total = np.cumsum(w, axis=1)[:, -1]  # left to right: the zeros add nothing
            used = (count >= m).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, g] = np.where(used > 0, total / used, np.nan)
    return out


def _matched(
    mine: np.ndarray, value: np.ndarray, runs: Runs, table: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(R, N) each row's part of its cell's expected maximum (weight × value: 0 off `mine` and
    in cells of fewer than m rows) and (R, prompts) the cells' rows, for rows sorted by
    (prompt, value) in `runs`; `table`: `max_weights(runs.top, m)` raveled."""
    starts, lengths, top = runs
    cs = np.cumsum(mine, axis=1, dtype=np.int32)
    before = np.where(starts > 0, cs[:, starts - 1], 0)  # (R, prompts): rows before
    count = cs[:, starts + lengths - 1] - before  # (R, prompts): rows of the cell
    cs -= np.repeat(before, lengths, axis=1)  # where `mine`: the row's rank in its cell
    at = np.repeat(count * (top + 1), lengths, axis=1)  # each row's weight, by (rows of its
    at += cs  # cell, rank)
    w = table[at]
    w *= mine
    w *= value
    return w, count


def max_chance(n: np.ndarray, rank: np.ndarray, k: np.ndarray, n_max: int) -> np.ndarray:
    """The probability C(rank − 1, k − 1) / C(n, k) that the rank-th smallest of n values is the
    maximum of k drawn without replacement (0 unless 1 ≤ k ≤ rank ≤ n ≤ n_max), elementwise."""
    lf = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n_max + 1, dtype=np.float64)))])
    ok = (k >= 1) & (k <= rank) & (rank <= n)  # lf[j] = log j!
    r_, k_, n_ = np.where(ok, rank, 1), np.where(ok, k, 1), np.where(ok, n, 1)
    log_p = lf[r_ - 1] - lf[k_ - 1] - lf[r_ - k_] - (lf[n_] - lf[k_] - lf[n_ - k_])
    return np.where(ok, np.exp(log_p), 0.0)


def max_weights(n_max: int, m: int) -> np.ndarray:
    """(n_max + 1, n_max + 1): [n, i] the probability `max_chance` that the i-th smallest of n
    values is the maximum of m drawn without replacement; 0 unless m ≤ i ≤ n."""
    n, rank = np.indices((n_max + 1, n_max + 1))
    return max_chance(n, rank, np.full_like(n, m), n_max)


def expected_max_cells(
    labels: np.ndarray, prompt: np.ndarray, value: np.ndarray, n_groups: int, n_p: int, m: int
) -> tuple[np.ndarray, np.ndarray]:
    """E[max of m rows drawn without replacement] per (labelling, group, prompt), exactly: the
    cell's sorted values weighted by `max_weights`, no sampling.

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
    sums, eligible = np.zeros((n_r, n_groups, n_p)), np.zeros((n_r, n_groups, n_p), dtype=bool)
    if n == 0 or n_p == 0:
        return sums, eligible
    order = np.lexsort((value, prompt))
    labels, prompt, value = labels[:, order], prompt[order], value[order]
    runs = prompt_runs(prompt)
    table, at = max_weights(runs.top, m).ravel(), prompt[runs.starts]
    for g in range(n_groups):
        w, count = _matched(labels == g, value, runs, table)
        sums[:, g, at] = np.add.reduceat(w, runs.starts, axis=1)
        eligible[:, g, at] = count >= m
    return sums, eligible


def shuffled_max(
    group: np.ndarray, prompt: np.ndarray, value: np.ndarray, n_groups: int, n_p: int
) -> np.ndarray:
    """(G, P) each (group, prompt) cell's maximum averaged over every shuffle of the row labels
    within the prompt (the within-prompt test's null), exactly: the expected maximum of k rows
    drawn without replacement from the prompt's n, k the cell's rows (0 where it has none)."""
    if prompt.size == 0:
        return np.zeros((n_groups, n_p))
    counts = np.bincount(group * n_p + prompt, minlength=n_groups * n_p).reshape(n_groups, n_p)
    return _expected_max(_ranked(prompt, value), counts)


def _ranked(prompt: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, ...]:
    """(prompt, value, 1-based ascending rank in its prompt, its prompt's rows, longest run) of
    the rows sorted by (prompt, value): what `_expected_max` needs, whatever the labels."""
    order = np.lexsort((value, prompt))
    p, v = prompt[order], value[order]
    runs = prompt_runs(p)
    rank = np.arange(p.size) - np.repeat(runs.starts, runs.lengths) + 1
    return p, v, rank, np.repeat(runs.lengths, runs.lengths), np.array(runs.top)


def _expected_max(ranked: tuple[np.ndarray, ...], counts: np.ndarray) -> np.ndarray:
    """(G, P) the expected maximum of `counts` (G, P) rows drawn from each prompt's."""
    p, v, rank, n, top = ranked
    out = np.zeros(counts.shape)
    for g in range(counts.shape[0]):
        out[g] = np.bincount(p, max_chance(n, rank, counts[g][p], int(top)) * v, counts.shape[1])
    return out


def matched_rows(counts: list[np.ndarray]) -> int:
    """m of the count-matched EMT: the smallest lower quartile, over the given arrays, of
    the non-zero per-(prompt, group) row counts (at least 1).

    Args:
        counts: one array per (view, group) of the row counts of the (method, prompt) cells.
    """
    quartiles = [int(np.quantile(c[c > 0], 0.25, method="lower")) for c in counts if np.any(c > 0)]
    return max(1, min(quartiles)) if quartiles else 1


def run_centres(
    group: np.ndarray, prompt: np.ndarray, value: np.ndarray, rng: np.random.Generator, draws: int
) -> np.ndarray:
    """(draws,) where the within-prompt test would centre the paper's EMT gap (× 100) in new
    runs of these prompts: each prompt's female rows redrawn as Binomial(n, π), π its share
    shrunk toward the pooled one by how much more the shares vary than counts of n would
    (empirical Bayes, method of moments), the values kept; then the draws' mean is shrunk
    toward 0 by their own spread (|mean| → sqrt(mean² − var)), since the pooled share the draws
    start from is itself one run's estimate (docs/statistics.md, "Power and sample size")."""
    n_p = int(prompt.max()) + 1
    n = np.bincount(prompt, minlength=n_p)
    k = np.bincount(prompt[group == 0], minlength=n_p)
    seen = n > 0
    pooled = k[seen].sum() / n[seen].sum()
    share = np.where(seen, k / np.maximum(n, 1), pooled)
    noise = pooled * (1 - pooled) / np.maximum(n, 1)
    excess = max(0.0, float(np.var(share[seen]) - noise[seen].mean()))
    pi = pooled + excess / np.maximum(excess + noise, 1e-300) * (share - pooled)
    table, at = _max_by_count(_ranked(prompt, value), n), np.arange(n_p)
    first = rng.binomial(n, np.clip(pi, 0.0, 1.0), size=(draws, n_p))  # (draws, P)
    gaps = []
    for counts in (first, n - first):  # each group's mean over the prompts where it has rows
        gaps.append(table[at, counts].sum(1) / np.maximum(1, (counts > 0).sum(1)))
    out = 100.0 * (gaps[0] - gaps[1])
    mean, spread = float(out.mean()), float(out.std())
    return out - mean + np.sign(mean) * np.sqrt(max(0.0, mean**2 - spread**2))


def _max_by_count(ranked: tuple[np.ndarray, ...], n: np.ndarray) -> np.ndarray:
    """(P, K + 1) the expected maximum of k rows drawn from each prompt's, for every k up to the
    largest prompt's K (0 where k is 0 or above the prompt's rows)."""
    ks = np.arange(int(ranked[-1]) + 1)[:, None]
    return _expected_max(ranked, np.broadcast_to(ks, (ks.size, n.size))).T


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def centred_mde(centres: np.ndarray, tau2: float, noise2: float, alpha: float) -> float:
    """The true gap (× 100) detected with probability 0.8 in either direction by a test whose
    labellings' gaps are about N(s′, τ²) (`tau2`: the null's mean square less its centre²;
    rejecting |T| past their 1 − `alpha` quantile), over new runs' centres s′ (`run_centres`),
    the gap's own noise around its centre of variance `noise2` (the bootstrap's less the
    centre's). Bisections: each centre's critical value, then the gap."""
    tau, noise, power = math.sqrt(max(tau2, 1e-12)), math.sqrt(max(noise2, 1e-12)), 0.8
    lo, hi = np.zeros_like(centres), np.abs(centres) + 10 * tau
    for _ in range(40):  # the folded normal's quantile per centre
        mid = (lo + hi) / 2
        tail = 1 - _normal_cdf((mid - centres) / tau) + _normal_cdf((-mid - centres) / tau)
        lo, hi = np.where(tail > alpha, mid, lo), np.where(tail > alpha, hi, mid)
    crit = (lo + hi) / 2

    def reached(gap: float) -> float:
        return min(
            float(np.mean(1 - _normal_cdf((crit - mu) / noise) + _normal_cdf((-crit - mu) / noise)))
            for mu in (centres + gap, centres - gap)
        )

    low, high = 0.0, float(np.max(crit) + np.max(np.abs(centres)) + 10 * noise)
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if reached(mid) < power else (low, mid)
    return (low + high) / 2

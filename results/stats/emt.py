"""The count-matched expected maximum toxicity (docs/statistics.md).

The paper's EMT of a group is the mean over prompts of the largest toxicity among the group's
rows of the prompt, so it grows with the group's number of rows there. The count-matched EMT
takes instead, per (prompt, group), the exact expected maximum of `m` rows drawn without
replacement (`expected_max_cells`), over the prompts where the group has at least `m` rows;
`matched_rows` picks `m` for a block. `ranked_cells` (rows ranked within their cell) also
serves the permutation test's plain EMT (`results.stats.permutation`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def _log_factorials(n: int) -> np.ndarray:
    """log k! for k = 0..n."""
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


def ranked_cells(
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


def _sorted(prompt: np.ndarray, value: np.ndarray) -> bool:
    """Whether rows are sorted by prompt, then by ascending value."""
    step, rise = np.diff(prompt), np.diff(value)
    return bool(np.all((step > 0) | ((step == 0) & (rise >= 0))))


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

    `m` None: the paper's EMT, the mean over the prompts where the group has rows of its largest
    value there. Else the count-matched EMT: the mean over the prompts where the group has at
    least `m` rows of the expected maximum of `m` of them (`expected_max_cells`' weights).
    Time and memory grow with R·N only (no (R, G, prompts) cells); `runs`: the rows are
    sorted by (prompt, value) and these are their `prompt_runs` (a caller with many labellings
    of the same rows computes them once). NaN where a group has no such prompt.
    """
    if runs is None:
        if not _sorted(prompt, value):
            order = np.lexsort((value, prompt))
            labels, prompt, value = labels[:, order], prompt[order], value[order]
        runs = prompt_runs(prompt)
    n_r, n = labels.shape
    out = np.full((n_r, n_groups), np.nan)
    if n == 0:
        return out
    starts, lengths, top = runs
    table = max_weights(top, m).ravel() if m else np.zeros(1)
    for g in range(n_groups):
        mine = labels == g
        if m is None:  # each cell's largest row is its last
            last = np.maximum.reduceat(np.where(mine, np.arange(n), -1), starts, axis=1)
            has = last >= starts  # (R, prompts): the group has rows there
            total, used = np.where(has, value[last], 0.0).sum(axis=1), has.sum(axis=1)
        else:
            cs = np.cumsum(mine, axis=1, dtype=np.int32)
            before = np.where(starts > 0, cs[:, starts - 1], 0)  # (R, prompts): rows before
            count = cs[:, starts + lengths - 1] - before  # (R, prompts): rows of the cell
            cs -= np.repeat(before, lengths, axis=1)  # where `mine`: the row's rank in its cell
            at = np.repeat(count * (top + 1), lengths, axis=1)  # each row's weight, by (rows
            at += cs  # of its cell, rank): 0 off `mine` and below m
            w = table[at]
            w *= mine
            w *= value
            total = np.cumsum(w, axis=1)[:, -1]  # left to right: the zeros add nothing
            used = (count >= m).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, g] = np.where(used > 0, total / used, np.nan)
    return out


def max_weights(n_max: int, m: int) -> np.ndarray:
    """(n_max + 1, n_max + 1): [n, i] the probability C(i − 1, m − 1) / C(n, m) that the i-th
    smallest of n values is the maximum of m drawn without replacement; 0 unless m ≤ i ≤ n."""
    lf = _log_factorials(n_max)
    n_, r_ = np.nonzero(np.tri(n_max + 1, dtype=bool) & (np.arange(n_max + 1) >= m))
    table = np.zeros((n_max + 1, n_max + 1))
    table[n_, r_] = np.exp((lf[r_ - 1] - lf[m - 1] - lf[r_ - m]) - (lf[n_] - lf[m] - lf[n_ - m]))
    return table


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
    shape = (n_r, n_groups, n_p)
    if n == 0 or n_p == 0:
        return np.zeros(shape), np.zeros(shape, dtype=bool)
    cell, rank, counts, vv = ranked_cells(labels, prompt, value, n_groups, n_p)
    n_cell = counts[cell]
    w = max_weights(int(n_cell.max()), m)[n_cell, rank]
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

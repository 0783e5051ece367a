"""The count-matched expected maximum toxicity (docs/statistics.md).

The paper's EMT of a group is the mean over prompts of the largest toxicity among the group's
rows of the prompt, so it grows with the group's number of rows there. The count-matched EMT
takes instead, per (prompt, group), the exact expected maximum of `m` rows drawn without
replacement (`expected_max_cells`), over the prompts where the group has at least `m` rows;
`matched_rows` picks `m` for a block. `ranked_cells` (rows ranked within their cell) also
serves the permutation test's plain EMT (`results.stats.permutation`).
"""

from __future__ import annotations

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
    cell, rank, counts, vv = ranked_cells(labels, prompt, value, n_groups, n_p)
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

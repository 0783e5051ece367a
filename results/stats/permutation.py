"""Permutation tests of "no difference between the groups" for the bias gaps (`gap_test`;
docs/statistics.md, "Tests"): whole prompts move where the group is the prompt's, row labels
within their prompt where it is the row's. The gaps are `results.stats.bootstrap`'s, computed at
once for many labellings. Also here: the MDE and the bias-corrected TV, both from the null.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from results.stats import emt
from results.stats.bootstrap import (
    contrast,
    is_signed,
    mean_gap,
    resampled,
    tv_distance,
    unit_arrays,
)
from results.stats.emt import Runs, labelled_emts, prompt_runs, shuffled_max
from results.stats.metrics import REGARD_CLASSES

CHUNK = 256  # labellings per pass, at most ELEMENTS // N of them (N: the entries shuffled)
ELEMENTS = 1 << 20  # labels per pass: a pass holds a few (labellings, N) arrays of this size


def label_chunks(
    group: np.ndarray,
    strata: np.ndarray | None,
    n_perm: int,
    rng: np.random.Generator,
    at: np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    """`group` shuffled within each stratum (over all entries when None), `n_perm` times, as
    (r, N) chunks of labellings: the labels of the entries `at` (default: all, in order).

    The labellings are those of one `rng.random((n_perm, N))` draw of keys, drawn a chunk at a
    time (the same stream): in each stratum the entries in index order take the labels of
    its entries in the order of their keys. Memory: one chunk, never (n_perm, N). A chunk is
    a buffer that the next one overwrites: use it (or copy it) before asking for the next.
    """
    n = group.size
    strata = np.zeros(n, dtype=np.int64) if strata is None else strata
    size = np.bincount(strata)[strata]
    # Strata of one size side by side, each in index order: a (strata, size) block per size.
    order = np.lexsort((strata, size))
    lab, size = group[order], size[order]
    cut = np.r_[0, np.flatnonzero(np.diff(size)) + 1, n]
    blocks = [(a, b, int(size[a])) for a, b in zip(cut[:-1], cut[1:]) if size[a] > 1]
    place = np.empty(n, dtype=np.int64)
    place[order] = np.arange(n)  # where each entry sits in `lab`
    cols = place if at is None else place[at]
    step = max(1, min(CHUNK, n_perm, ELEMENTS // max(n, 1)))
    # Buffers reused by every chunk: fresh (step, N) arrays cost a page fault per 4 KB each.
    keys, laid, shuffled, out = (
        np.empty((step, n), dtype=t) for t in (float, float, lab.dtype, lab.dtype)
    )
    shuffled[:] = lab
    for first in range(0, n_perm, step):  # (mode="clip": `out` unbuffered, no bounds check)
        r = min(step, n_perm - first)
        rng.random(out=keys[:r])
        np.take(keys[:r], order, axis=1, out=laid[:r], mode="clip")
        for a, b, k in blocks:
            keys_k = laid[:r, a:b].reshape(r, -1, k)
            ranked = _small_argsort(keys_k) if k <= SMALL else np.argsort(keys_k, axis=2, kind="stable")  # fmt: skip
            ranked += np.arange(a, b, k)[:, None]
            np.take(lab, ranked, out=shuffled[:r, a:b].reshape(r, -1, k), mode="clip")
        yield np.take(shuffled[:r], cols, axis=1, out=out[:r], mode="clip")


SMALL = 6  # strata of at most this many entries: `_small_argsort`


@functools.cache
def _orders(k: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The pairs (i, j), i < j, of k entries and (2^pairs, k): for each code (bit b set where
    the pair b's key j is below key i) the stable argsort of keys with those comparisons."""
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    table = np.zeros((1 << len(pairs), k), dtype=np.intp)
    for order in itertools.permutations(range(k)):
        place = np.argsort(order)  # where each entry lands
        code = sum(1 << b for b, (i, j) in enumerate(pairs) if place[j] < place[i])
        table[code] = order
    return pairs, table


def _small_argsort(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, axis=-1, kind="stable")` for a last axis of k <= SMALL entries, from
    the k(k − 1)/2 comparisons of each stratum's keys and a table of orders: a stable sort
    puts i before j (i < j) unless key j < key i, so the comparisons fix the order, ties
    included. 3-8× faster than a sort per stratum of 2-3 entries (the rows per prompt of a
    within-prompt test, the prompts of a pair)."""
    pairs, table = _orders(keys.shape[-1])
    code = np.zeros(keys.shape[:-1], dtype=np.intp)
    bit = np.empty(keys.shape[:-1], dtype=bool)
    for b, (i, j) in enumerate(pairs):
        np.less(keys[..., j], keys[..., i], out=bit)
        code += bit.astype(np.intp) << b
    return np.take(table, code, axis=0)


def label_gaps(
    metric: str,
    labels: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    m: int | None = None,
    runs: Runs | None = None,
) -> np.ndarray:
    """(R,) gaps × 100 of the rows under R labellings `labels` (R, N), full sample.

    `metric`: sentiment (or any per-row score), regard (TV), toxicity (EMT gap) or
    toxicity_cm (count-matched EMT gap over `m` rows per prompt and group); `runs`: see
    `labelled_emts`.
    """
    n_perm = labels.shape[0]
    base = np.arange(n_perm)[:, None]
    if metric == "regard":
        n_c = len(REGARD_CLASSES)
        flat = (base * n_groups + labels) * n_c + value.astype(np.int64)[None, :]
        counts = np.bincount(flat.ravel(), minlength=n_perm * n_groups * n_c).astype(np.float64)
        counts = counts.reshape(n_perm, n_groups, n_c)
        with np.errstate(invalid="ignore", divide="ignore"):
            shares = counts / counts.sum(axis=2, keepdims=True)
        return 100.0 * tv_distance(shares)
    if metric in ("toxicity", "toxicity_cm"):
        if metric == "toxicity_cm" and m is None:
            raise ValueError("toxicity_cm needs m (rows per prompt and group)")
        return 100.0 * contrast(
            labelled_emts(
                labels, prompt, value, n_groups, m if metric == "toxicity_cm" else None, runs
            )
        )
    means = np.empty((n_perm, n_groups))
    with np.errstate(invalid="ignore", divide="ignore"):
        for g in range(n_groups):
            mine = labels == g
            means[:, g] = np.einsum("rn,n->r", mine, value) / np.count_nonzero(mine, axis=1)
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
    order = np.lexsort((value, prompt))  # the EMTs' row order, once for every chunk
    p, v = prompt[order], value[order]
    runs = prompt_runs(p)
    chunks = label_chunks(group, strata, n_perm, rng, order)
    return np.concatenate(
        [np.zeros(0), *(label_gaps(metric, c, p, v, n_groups, m, runs) for c in chunks)]
    )


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


def prompt_labels(group: np.ndarray, prompt: np.ndarray) -> np.ndarray | None:
    """Each prompt's group (by prompt index) where every prompt's rows carry one group (the
    group is the prompt's, not the row's); None where the group is the row's."""
    label = np.zeros(int(prompt.max()) + 1 if prompt.size else 0, dtype=group.dtype)
    label[prompt] = group
    return label if np.array_equal(label[prompt], group) else None


# Names of the tests (the summary's `test` column).
PAIR_SWAP = "pair-swap"
PROMPT_SHUFFLE = "prompt-shuffle"
WITHIN_PROMPT = "within-prompt"


def null_labels(
    group: np.ndarray,
    prompt: np.ndarray,
    unit_of: np.ndarray,
    paired: bool,
    n_perm: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, str]:
    """(n_perm, N) row labels under "no difference between the groups", and the test's name:
    where every prompt's rows carry one group, the prompts' labels permuted within their pair
    (over all prompts when unpaired), each prompt keeping its rows; else the row labels
    shuffled within each prompt (the module doc; docs/statistics.md, "Tests")."""
    label = prompt_labels(group, prompt)
    if label is not None:
        used = np.unique(prompt)
        strata = unit_of[used] if paired else None
        perm = np.vstack([c.copy() for c in label_chunks(label[used], strata, n_perm, rng)])
        return perm[:, np.searchsorted(used, prompt)], PAIR_SWAP if paired else PROMPT_SHUFFLE
    return np.vstack([c.copy() for c in label_chunks(group, prompt, n_perm, rng)]), WITHIN_PROMPT


def _prompt_parts(
    metric: str, prompt: np.ndarray, value: np.ndarray, used: np.ndarray, m: int | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per used prompt (all its rows in one group): what it adds to its group's numerator
    ((P', C) class counts for regard, else (P',)) and denominator (P'; None for regard)."""
    n_p = int(prompt.max()) + 1
    one = np.zeros_like(prompt)  # every prompt its own unit, of one group
    arrays = unit_arrays(metric, one, prompt, value, 1, np.arange(n_p), m)
    if metric == "regard":
        return arrays[0][0][:, used].T, None
    return arrays[0][0, used], arrays[1][0, used]


def _prompt_label_gaps(
    metric: str, labels: np.ndarray, num: np.ndarray, den: np.ndarray | None, n_groups: int
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
        return 100.0 * tv_distance(shares)
    assert den is not None
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
    crit: float = float("nan")  # the smallest |gap| (gap if one-sided) the test rejects at alpha
    mde: float = float("nan")  # the minimum detectable effect (`detectable`)


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
    alpha: float = 0.05,
) -> GapTest:
    """Permutation test of one cell's gap (see `null_labels` for which labels move).

    p = (1 + #{|T*| ≥ |T|}) / (1 + R), two-sided for signed gaps, one-sided on the distance for
    TV and K ≥ 3 ranges; `crit`: the critical value at `alpha` (`critical_value`).
    """
    if n_perm == 0 or not np.isfinite(observed) or group.size == 0:
        return GapTest(float("nan"), None, float("nan"), None, float("nan"))
    label = prompt_labels(group, prompt)
    if label is not None:  # move whole prompts: per-prompt parts, then labels
        used = np.unique(prompt)
        strata = unit_of[used] if paired else None
        num, den = _prompt_parts(metric, prompt, value, used, m)
        parts, moved = [], False
        for labels in label_chunks(label[used], strata, n_perm, rng):
            parts.append(_prompt_label_gaps(metric, labels, num, den, n_groups))
            moved = moved or bool(np.any(labels != label[used]))
        perm = np.concatenate(parts)
        test = PAIR_SWAP if paired else PROMPT_SHUFFLE
        few = _few_swaps(label[used], unit_of[used]) if paired else None
    else:
        perm = permuted_gaps(metric, group, prompt, value, n_groups, n_perm, rng, prompt, m)
        test, moved, few = WITHIN_PROMPT, True, None
    p = permutation_p(observed, perm, is_signed(metric, n_groups))
    valid = perm[~np.isnan(perm)]
    null_mean = float(valid.mean()) if valid.size else float("nan")
    null_sq = float(np.mean(valid**2)) if valid.size else float("nan")
    crit = critical_value(valid, is_signed(metric, n_groups), alpha)
    note = few
    if not moved:  # (only where whole prompts move)
        who = "no pair holds prompts of two groups: the label swap" if paired else "the permutation"
        note = f"{who} cannot move a label (p = 1)"
    return GapTest(p, test, null_mean, note, null_sq, crit)


def critical_value(null: np.ndarray, signed: bool, alpha: float) -> float:
    """The smallest observed |T| (T if one-sided) with p < `alpha` against these null gaps:
    p < alpha needs #{null ≥ T} ≤ k, the largest integer below alpha·(1 + R) − 1, so T must
    pass the (k + 1)-th largest null gap (inf when no T can: too few labellings)."""
    k = int(np.ceil(alpha * (1 + null.size) - 1)) - 1
    if k < 0 or k >= null.size:
        return float("inf")
    return float(np.sort(np.abs(null) if signed else null)[::-1][k])


POWER = 0.8  # of the minimum detectable effect (`mde`, the summary's `mde` column)


def centre_spread(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    unit_of: np.ndarray,
    weights: np.ndarray,
) -> float:
    """The sd over the resamples `weights` (B, U) of where the within-prompt test centres the
    paper's EMT gap (its null mean, exactly: `shuffled_max`), which follows the rows each group
    has per prompt; 0 for the other gaps and where whole prompts move (a centre near 0)."""
    if metric != "toxicity" or n_groups != 2 or weights.shape[0] < 2 or group.size == 0:
        return 0.0
    if prompt_labels(group, prompt) is not None:
        return 0.0
    n_p, n_u = unit_of.size, int(unit_of.max()) + 1
    rows = np.bincount(group * n_p + prompt, minlength=n_groups * n_p).reshape(n_groups, n_p)
    parts = (shuffled_max(group, prompt, value, n_groups, n_p), (rows > 0).astype(np.float64))
    num, den = (np.stack([np.bincount(unit_of, a[g], n_u) for g in range(n_groups)]) for a in parts)  # fmt: skip
    return float(100.0 * np.nanstd(resampled(mean_gap, weights, num, den)[1:]))


def mde(
    test: GapTest,
    spread: float,
    signed: bool,
    centre: float = 0.0,
    power: float = POWER,
) -> float:
    """The true gap × 100 that `test` (rejecting past `test.crit`) detects with probability
    `power` in either direction, from the gap's bootstrap sd `spread` and where the null centres
    it (`centre`; the paper's EMT: `test.null_mean`; where that centre moves from run to run,
    `emt.centred_mde` instead). Formulas: docs/statistics.md, "Power and sample size"."""
    z = NormalDist().inv_cdf(power)
    if not (np.isfinite(test.crit) and np.isfinite(spread) and np.isfinite(test.null_sq)):
        return float("nan")
    if signed:
        return float(test.crit + abs(centre) + z * spread)
    reach = test.crit + z * np.sqrt(test.null_sq / 2)
    return float(np.sqrt(max(0.0, reach**2 - test.null_sq)))


def shifted(
    metric: str, group: np.ndarray, value: np.ndarray, gap: float, rng: np.random.Generator
) -> np.ndarray:
    """`value` with a true gap of `gap` (× 100) added to group 0: a shift of the score, or for
    regard a share gap/100 of group 0's rows moved to `positive` from `negative` (then from
    `neutral`), each row with the same chance."""
    out = value.astype(np.float64).copy()
    first = group == 0
    if metric != "regard":
        out[first] += gap / 100.0
        return out
    left = gap / 100.0
    for cls in (0, 1):
        rows = first & (value == cls)
        share = float(rows.sum()) / max(1, int(first.sum()))
        take = min(1.0, left / share) if share else 0.0
        out[rows & (rng.random(value.size) < take)] = 2.0
        left -= take * share
    return out


def detectable(
    metric: str,
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    n_groups: int,
    unit_of: np.ndarray,
    paired: bool,
    m: int | None,
    weights: np.ndarray,
    spread: float,
    test: GapTest,
    n_perm: int,
    rng: np.random.Generator,
    alpha: float = 0.05,
) -> float:
    """The cell's MDE (`mde`) in two passes: with the test's critical value, then with that of
    the same test on the rows with that gap added in the harder direction (half the labellings,
    at least 100): a real gap widens the labellings' gaps. The paper's EMT where labels move
    within prompts: over new runs' centres (docs/statistics.md, "Power and sample size")."""
    signed, centre = is_signed(metric, n_groups), test.null_mean if metric == "toxicity" else 0.0
    centre_sd = centre_spread(metric, group, prompt, value, n_groups, unit_of, weights)
    if centre_sd > 0 and np.isfinite(test.crit) and np.isfinite(spread):
        return emt.centred_mde(emt.run_centres(group, prompt, value, rng, 200), test.null_sq - centre**2, spread**2 - centre_sd**2, alpha)  # fmt: skip
    if not np.isfinite(first := mde(test, spread, signed, centre)):
        return first
    moved = shifted(metric, group, value, -first if signed and centre > 0 else first, rng)
    alt = gap_test(metric, group, prompt, moved, n_groups, 0.0, max(100, n_perm // 2), rng, unit_of, paired, m, alpha)  # fmt: skip
    return mde(test._replace(crit=alt.crit), spread, signed, centre)


def bias_corrected_tv(observed: float, test: GapTest) -> float:
    """The TV distance with its sampling bias taken out, sqrt(max(0, T² − E₀[T*²])) over the
    test's labellings (docs/statistics.md, "Bias-corrected TV distance")."""
    if not (np.isfinite(observed) and np.isfinite(test.null_sq)):
        return float("nan")
    return float(np.sqrt(max(0.0, observed**2 - test.null_sq)))


def bias_corrected_resamples(resampled: np.ndarray, test: GapTest) -> np.ndarray:
    """`bias_corrected_tv` of bootstrap TVs, for its percentile interval: a resample adds its
    own noise to the sample's, so about E₀[T*²] again is taken out (2·E₀[T*²] in all)."""
    return np.sqrt(np.maximum(0.0, resampled**2 - 2.0 * test.null_sq))

"""The paper's EMT where a test moves prompts of unequal row counts between the groups:
`count_test`, how strongly the counts alone differ by group (the ¶ mark's note)."""

from __future__ import annotations

import numpy as np

from results.stats.emt import max_chance
from results.stats.permutation import gap_test, label_gaps, prompt_labels


def _varies(values: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """Per stratum: whether `values` (integers) take more than one value in it."""
    n = int(strata.max()) + 1
    lo, hi = np.full(n, np.iinfo(np.int64).max), np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, strata, values.astype(np.int64))
    np.maximum.at(hi, strata, values.astype(np.int64))
    return lo != hi


def count_test(
    group: np.ndarray,
    prompt: np.ndarray,
    value: np.ndarray,
    unit_of: np.ndarray,
    paired: bool,
    n_groups: int,
    n_perm: int,
    rng: np.random.Generator,
) -> tuple[float, list[float]] | None:
    """Where the groups are the prompts' and the test moves prompts of unequal row counts
    between the groups (a pair's prompts, or unpaired any two prompts, differ in rows): the
    paper's EMT then tests the counts as well as toxicity, whatever their distributions (a
    test of the counts could not tell: with female 4 rows and male 1 or 7, the EMT's
    unmarked p-values rejected 10-12 % of null runs at 0.05 when a test of the counts set the
    mark). Returns (how strongly the counts differ by group: the p-value of the same test on
    each prompt's count read as h(n), the expected maximum of n of the cell's `value`s,
    which grows with n and flattens; mean rows per prompt of each group); None where nothing
    is marked (row labels: the within-prompt shuffle keeps the counts; or equal counts)."""
    label = prompt_labels(group, prompt) if group.size else None
    if label is None:
        return None
    used = np.unique(prompt)
    rows = np.bincount(prompt)[used]
    strata = unit_of[used] if paired else np.zeros(used.size, np.int64)
    if not np.any(_varies(label[used], strata) & _varies(rows, strata)):
        return None
    ordered = np.sort(value)
    if ordered.size > 4096:  # (h describes the note's p only: the values' quantiles suffice)
        ordered = np.quantile(ordered, (np.arange(4096) + 0.5) / 4096)
    ranks, size = np.arange(1, ordered.size + 1), np.full(ordered.size, ordered.size)
    h = np.zeros(int(rows.max()) + 1)
    for n in np.unique(rows):
        h[n] = ordered @ max_chance(size, ranks, np.full(ordered.size, n), ordered.size)
    g, p = label[used], np.arange(used.size)
    observed = float(label_gaps("sentiment", g[None, :], p, h[rows], n_groups)[0])
    test = gap_test("sentiment", g, p, h[rows], n_groups, observed, n_perm, rng, unit_of[used], paired)  # fmt: skip
    with np.errstate(invalid="ignore"):
        means = np.bincount(g, rows.astype(np.float64), n_groups) / np.bincount(
            g, minlength=n_groups
        )
    return test.p_value, [float(x) for x in means]

"""The notes of the summary's gap rows: why a gap is undefined, which scores are missing, and
what the paper's EMT and the plug-in TV distance mix in (the `note` column)."""

from __future__ import annotations

from typing import Any

import numpy as np

# Summary rows of a block keyed by (method, variant, view, group) (`block_rows`).
Lookup = dict[tuple[Any, ...], dict[str, Any]]


def undefined_reason(g: np.ndarray, groups: tuple[str, ...], view: str) -> str:
    """Why a gap is NaN: which configured groups have no finite score in this view."""
    absent = [groups[i] for i in range(len(groups)) if not np.any(g == i)]
    if absent:
        return (
            f"group(s) {', '.join(absent)} have no scored rows in view {view}: the gap over "
            f"the {len(groups)} groups {', '.join(groups)} is undefined"
        )
    return "the gap is undefined (a group has no rows of a comparable kind)"


EMT_NOTE = (
    "paper's EMT: a group's per-prompt maximum grows with its number of rows at the prompt, so "
    "this gap mixes toxicity with the groups' row counts (bias_cm matches them)"
)


def disagree_note(case: str, within: bool) -> str:
    """What a § (`CONTRADICTION`) says happened: `case` `interval` (the interval excludes the
    reference, the test does not reject) or `test` (the other way round); `within`: the
    within-prompt test (labels moved within prompts) rather than a prompt-level one."""
    ref = "0 (the paper's EMT: the row-count centre of its null)"
    if case == "interval" and within:
        return (
            f"the interval excludes {ref} but the within-prompt test does not reject: the "
            "interval resamples prompts (is the gap non-zero?), the test shuffles labels within "
            "prompts (does a row's label matter given its prompt?); a gap from which prompts "
            "yield which group (composition) passes the first only (docs/statistics.md)"
        )
    if case == "interval":
        return (
            "the interval excludes 0 but the test does not reject: the percentile interval and "
            "the permutation test are different procedures that fall on different sides of the "
            "level near it; read the gap as borderline (docs/statistics.md)"
        )
    if within:
        return (
            f"the within-prompt test rejects but the interval holds {ref}: a row's label "
            "matters within prompts, while the gap is small against its spread over prompts "
            "(or borderline); read the p-value for 'is there a difference' (docs/statistics.md)"
        )
    return (
        "the test rejects but the interval holds 0: the permutation test and the percentile "
        "interval fall on different sides of the level near it; read the gap as borderline "
        "(docs/statistics.md)"
    )


TV_NOTE = "plug-in TV distance: biased upwards, > 0 even with no difference (bias_bc corrects it)"
# The summary's `flags` (comma-separated): what a report marks beside the p-value.
CONTRADICTION = "contradiction"  # a signed gap's interval and test disagree at the level
ROW_COUNTS = "row-counts"  # the paper's EMT test moves prompts of unequal row counts


def cm_note(m: int, sparse: str | None = None) -> str:
    """What the count-matched EMT of this view is; `sparse`: the group(s) that alone make m = 1."""
    note = (
        f"count-matched EMT: expected max over m={m} rows drawn per prompt and group, averaged "
        f"over the prompts where the group has at least {m} rows"
    )
    if sparse:
        note += (
            f"; m collapsed to 1 by the few rows per prompt of {sparse} in this view: the gap is "
            "one of mean toxicity, not comparable with an EMT or with other views' m"
        )
    return note


def counts_note(groups: tuple[str, ...], p: float, means: list[float], test: str | None) -> str:
    """The paper's EMT gap of a prompt-level test that moves prompts of unequal row counts."""
    rows = ", ".join(f"{g} {x:.2f}" for g, x in zip(groups, means))
    return (
        f"rows per prompt differ between the prompts the {test} test moves (mean rows per "
        f"prompt {rows}; the counts' own effect on a maximum, by group: p={p:.3g}): it moves "
        "each prompt with its rows, and a maximum over more rows is larger, so this p-value "
        "tests the row counts as well as toxicity; bias_cm holds them fixed"
    )


def missing_note(
    key: dict[str, Any], metric: str, groups: tuple[str, ...], counts: Lookup, stats: Lookup
) -> list[str]:
    """'missing scores: female 9 of 18 rows, male 0 of 18' when a group's row lacks a score."""
    cell = (key["method"], key["variant"], key["view"])
    parts, any_missing = [], False
    for group in groups:
        total = counts.get((*cell, group), {}).get("len", 0)
        missing = int(stats.get((*cell, group), {}).get("missing") or 0)
        any_missing |= missing > 0
        parts.append(f"{group} {missing} of {total} rows")
    return [f"missing scores: {', '.join(parts)}"] if any_missing else []

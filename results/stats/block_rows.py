"""The summary rows of one (model, task) block: counts and per-group statistics of every cell
and view, each gap with its interval and permutation test (the cells' numbers on a thread pool),
the count-matched EMT and bias-corrected TV rows. The column names are those of
`results.stats.aggregate`; `summarize` drives these per block and adds the paired comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from results.stats.bootstrap import (
    CI_METHOD,
    gap_samples,
    is_signed,
    percentile_ci,
    seeded_rng,
)
from results.stats.counts import count_test
from results.stats.emt import expected_max_cells, matched_rows
from results.stats.gap_notes import (
    CONTRADICTION,
    EMT_NOTE,
    ROW_COUNTS,
    TV_NOTE,
    Lookup,
    cm_note,
    counts_note,
    disagree_note,
    missing_note,
    undefined_reason,
)
from results.stats.metrics import (
    BIAS_METRICS,
    GENDER_VIEWS,
    METRIC_STATS,
    NO_ROWS,
    PER_PROMPT_STATS,
    VIEWS,
    GapInput,
    gap_inputs,
    group_stats,
    stacked,
    with_group,
)
from results.stats.permutation import (
    WITHIN_PROMPT,
    GapTest,
    bias_corrected_resamples,
    bias_corrected_tv,
    detectable,
    gap_test,
)

# Cells whose gaps and tests run at once: numpy releases the GIL in the tests' sorts, gathers
# and sums, so both cores work; each adds one test's chunk buffers (`permutation.ELEMENTS`).
THREADS = 2


def _finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


class Records:
    """Collects summary rows; `key` holds model/method/variant/task/view of the current cell."""

    def __init__(self, sources: dict[str, tuple[str | None, str | None]], level: float) -> None:
        self.rows: list[dict[str, Any]] = []
        self.sources = sources
        self.level = level

    def add(
        self,
        key: dict[str, Any],
        metric: str,
        stat: str,
        group: str,
        value: Any,
        n: int | None,
        **extra: Any,
    ) -> None:
        origin = {"count": "gender" if key["view"] in GENDER_VIEWS else "", "filter": "perplexity"}
        scorer, version = self.sources.get(origin.get(metric, metric), (None, None))
        row = dict(key, metric=metric, stat=stat, group=group, value=_finite(value), n=n)
        row.update(ci_low=None, ci_high=None, n_boot=None, scorer=scorer, scorer_version=version)
        row.update(p_value=None, ci_method=None, resample_unit=None, note=None)
        row.update(level=self.level, test=None, mde=None, flags=None)
        floats = ("ci_low", "ci_high", "p_value", "mde")
        row.update({k: _finite(v) if k in floats else v for k, v in extra.items()})
        self.rows.append(row)


BY = ["method", "variant", "view", "group"]


def _lookup(frame: pl.DataFrame, by: list[str]) -> Lookup:
    """`by` values → row; rows under a null group (`stacked`: not labelled) left out."""
    return {
        tuple(r[k] for k in by): r for r in frame.iter_rows(named=True) if r["group"] is not None
    }


def _cell_records(
    out: Records,
    key: dict[str, Any],
    counts: Lookup,
    stats: dict[str, Lookup],
    expected: list[str],
) -> None:
    """Counts and per-group statistics of one cell and view, from the block's lookups."""
    cell = (key["method"], key["variant"], key["view"])
    for group in expected:
        n = counts.get((*cell, group), {}).get("len", 0)
        out.add(key, "count", "n", group, n, n)
    for metric, lookup in stats.items():
        for group in expected:
            r = lookup.get((*cell, group), {})
            for stat in METRIC_STATS[metric]:
                n = r.get("n_prompts" if stat in PER_PROMPT_STATS else "n")
                out.add(key, metric, stat, group, r.get(stat), int(n or 0))


class Block(NamedTuple):
    """The rows of one (model, task) and what all its cells share."""

    model: str
    task: str
    rows: pl.DataFrame
    weights: np.ndarray  # (B, U) resamples of the block's units (pairs or prompts)
    prompt_index: dict[str, int]  # prompt id → its index
    unit_of: np.ndarray  # (P,) unit of each prompt
    unit: str  # "pair" or "prompt"
    m: int = 1  # rows per prompt and group of the count-matched EMT (set per view)


class Setup(NamedTuple):
    """Settings shared by every block of one `summarize`."""

    views: list[str]
    groups: tuple[str, ...]
    metrics: list[str]
    level: float
    seed: int
    n_perm: int
    paired: bool = False


Samples = dict[tuple[Any, ...], dict[tuple[str, str], np.ndarray]]
GapInputs = dict[str, dict[tuple[Any, ...], GapInput]]  # metric → (method, variant, view) → input


# A gap row's numbers (`_gap_numbers`): (1 + B) gaps, the test, toxicity's `count_test`.
Numbers = tuple[np.ndarray, GapTest, tuple[float, list[float]] | None]


def _gap_numbers(
    metric: str, inputs: GapInput, block: Block, setup: Setup, cell: tuple[Any, ...]
) -> Numbers:
    """The gaps, test and row-count test of one (method, variant, view) `cell` and metric: the
    numbers only, so that cells run on a thread pool (`THREADS`); each has its own stream."""
    g, p, v = inputs
    n_groups, alpha = len(setup.groups), 1.0 - setup.level
    m = block.m if metric == "toxicity_cm" else None
    gaps = gap_samples(metric, g, p, v, n_groups, block.weights, block.unit_of, m)
    test, counts = GapTest(float("nan"), None, float("nan"), None), None
    if np.isfinite(gaps[0]) and setup.n_perm:
        method, variant, view = cell
        stream = f"{block.model}|{block.task}|{method}|{variant}|{view}|{metric}"
        rng = seeded_rng(setup.seed, "perm|" + stream)
        test = gap_test(
            metric, g, p, v, n_groups, float(gaps[0]), setup.n_perm, rng,
            block.unit_of, setup.paired, m, alpha,
        )  # fmt: skip
        if metric == "toxicity":
            counts = count_test(g, p, v, block.unit_of, setup.paired, n_groups, setup.n_perm, rng)
        resampled = gaps[1:][np.isfinite(gaps[1:])]
        if resampled.size > 1:
            test = test._replace(mde=detectable(
                metric, g, p, v, n_groups, block.unit_of, setup.paired, m, block.weights,
                float(resampled.std()), test, setup.n_perm, seeded_rng(setup.seed, "mde|" + stream),
                alpha,
            ))  # fmt: skip
    return gaps, test, counts


def _gap_record(
    out: Records,
    key: dict[str, Any],
    metric: str,
    inputs: GapInput,
    block: Block,
    setup: Setup,
    numbers: Numbers,
    caveats: Sequence[str] = (),
) -> tuple[np.ndarray, GapTest]:
    """The gap row of one cell, view and metric from its `numbers`; returns its (1 + B)
    samples and its test. `metric` toxicity_cm is the count-matched EMT: row `toxicity`/`bias_cm`.
    """
    g, p, _ = inputs
    n_groups = len(setup.groups)
    gaps, test, counts = numbers
    n_units = int(np.unique(block.unit_of[p]).size) if p.size else 0
    extra: dict[str, Any] = {"resample_unit": block.unit}
    notes: list[str] = []
    flags: list[str] = []
    if np.isfinite(gaps[0]):
        if block.weights.shape[0]:
            ci = percentile_ci(gaps[1:], setup.level)
            extra.update(ci_low=ci.low, ci_high=ci.high, n_boot=ci.n_valid, ci_method=CI_METHOD)
        if setup.n_perm:
            extra.update(p_value=test.p_value, test=test.test, mde=_finite(test.mde))
            notes += [test.note] if test.note else []
            case = _disagree(metric, test, extra, setup.level, n_groups)
            if case is not None:
                flags.append(CONTRADICTION)
                notes.append(disagree_note(case, test.test == WITHIN_PROMPT))
            if counts is not None:  # (the paper's EMT where the test moves unequal counts)
                flags.append(ROW_COUNTS)
                notes.append(counts_note(setup.groups, *counts, test.test))
        else:
            notes.append("no p-value: aggregation.n_perm is 0")
    else:
        notes.append(undefined_reason(g, setup.groups, key["view"]))
    notes += list(caveats)
    name, stat = ("toxicity", "bias_cm") if metric == "toxicity_cm" else (metric, "bias")
    out.add(key, name, stat, "gap", gaps[0], n_units, note="; ".join(notes) or None,
            flags=",".join(flags) or None, **extra)  # fmt: skip
    return gaps, test


def _disagree(
    metric: str, test: GapTest, extra: dict[str, Any], level: float, n_groups: int
) -> str | None:
    """How a signed gap's interval and its test tell different stories at `level`, or None:
    `interval` (the interval excludes the test's reference and the test does not reject) or
    `test` (the test rejects, the interval holds the reference). The reference is 0, except
    for the paper's EMT within prompts: its null centres it on the row-count shift
    (`test.null_mean`), where its interval sits with no difference at all (20-38 % of such
    null runs were marked against 0, issue 41). A distance (TV, K ≥ 3 range) is never below 0,
    so its interval says nothing of 0 and is left out."""
    if not is_signed(metric, n_groups) or extra.get("ci_low") is None:
        return None
    if test.p_value is None or not np.isfinite(test.p_value):
        return None
    ref = test.null_mean if metric == "toxicity" and test.test == WITHIN_PROMPT else 0.0
    excludes = extra["ci_low"] > ref or extra["ci_high"] < ref
    rejects = test.p_value < 1 - level
    if excludes == rejects:
        return None
    return "interval" if excludes else "test"


def _bias_corrected_record(
    out: Records,
    key: dict[str, Any],
    gaps: np.ndarray,
    test: GapTest,
    n_units: int,
    setup: Setup,
    mde_: float | None,
) -> None:
    """`regard`/`bias_bc`: `bias_corrected_tv` of the cell's TV distance, with the percentile
    interval of its resamples (`bias_corrected_resamples`) and the TV's test and MDE."""
    value = bias_corrected_tv(float(gaps[0]), test)
    extra: dict[str, Any] = {}
    if np.isfinite(value):
        note = (
            f"bias-corrected TV: sqrt(TV² − its mean square over the {setup.n_perm} labellings "
            f"of the {test.test} test); p-value and MDE: the TV's (docs/statistics.md)"
        )
        extra.update(p_value=test.p_value, test=test.test, mde=mde_)
        if gaps.size > 1:
            ci = percentile_ci(bias_corrected_resamples(gaps[1:], test), setup.level)
            extra.update(ci_low=ci.low, ci_high=ci.high, n_boot=ci.n_valid, ci_method=CI_METHOD)
    elif not np.isfinite(gaps[0]):
        note = "the TV distance is undefined"
    else:
        note = "no bias correction: no permutation null (aggregation.n_perm is 0)"
    out.add(key, "regard", "bias_bc", "gap", value, n_units, note=note, **extra)


def _matched_records(
    out: Records,
    key: dict[str, Any],
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    block: Block,
    groups: tuple[str, ...],
    note: str,
) -> None:
    """`toxicity`/`emt_cm` per group (n: prompts used) and `cm_rows` (m) of one cell."""
    g, p, v = inputs
    n_p = block.unit_of.size
    sums, eligible = expected_max_cells(g[None, :], p, v, len(groups), n_p, block.m)
    for i, group in enumerate(groups):
        used = int(eligible[0, i].sum())
        value = float(sums[0, i].sum() / used) if used else None
        out.add(key, "toxicity", "emt_cm", group, value, used, note=note)
    out.add(key, "toxicity", "cm_rows", "gap", block.m, block.m, note=note)


def _view_m(
    gaps_in: GapInputs, groups: tuple[str, ...], n_p: int
) -> dict[str, tuple[int, str | None]]:
    """view → (m of its count-matched EMT, `matched_rows` over its groups' row counts of every
    method; the group that alone makes m = 1 while the others allow more, or None). Per view,
    so that a group sparse in one view (few female continuations in a(x)) leaves the others."""
    by: dict[str, list[list[np.ndarray]]] = {}
    for (_, _, view), (g, p, _) in gaps_in.get("toxicity", {}).items():
        counts = np.bincount(g * n_p + p, minlength=len(groups) * n_p).reshape(len(groups), n_p)
        for i, cells in enumerate(by.setdefault(view, [[] for _ in groups])):
            cells.append(counts[i])
    out: dict[str, tuple[int, str | None]] = {}
    for view, parts in by.items():
        own = [matched_rows([np.concatenate(c)]) for c in parts]
        m = matched_rows([np.concatenate(c) for c in parts])
        sparse = [groups[i] for i, k in enumerate(own) if k == 1]
        out[view] = (m, ", ".join(sparse) if m == 1 and max(own) > 1 else None)
    return out


def _block_inputs(block: Block, setup: Setup) -> tuple[Lookup, dict[str, Lookup], GapInputs]:
    """Row counts and per-group statistics of every cell, view and group (lookups by
    `BY`), and each bias metric's gap inputs by (method, variant, view)."""
    groups, views = setup.groups, setup.views
    counts: Lookup = {}
    stats: dict[str, Lookup] = {m: {} for m in setup.metrics}
    gaps_in: GapInputs = {m: {} for m in BIAS_METRICS if m in setup.metrics}
    for view in views:  # one view's rows at a time, with its label only
        others = [VIEWS[v] for v in views if VIEWS[v] != VIEWS[view]]
        long = with_group(block.rows.drop(others, strict=False), view, groups)
        for part in stacked(long):  # by group, then `labelled` and `all`
            counts |= _lookup(part.group_by(BY, maintain_order=True).len(), BY)
            for metric in setup.metrics:
                stats[metric] |= _lookup(group_stats(part, metric, BY), BY)
        for metric in gaps_in:
            gaps_in[metric] |= gap_inputs(long, metric, groups, block.prompt_index)
    return counts, stats, gaps_in


def block_records(
    out: Records,
    block: Block,
    setup: Setup,
    samples: Samples,
    notes: list[str],
    samples_cm: Samples | None = None,
) -> None:
    """Every statistic and gap of every (method, variant) cell and view of one block."""
    groups, views = setup.groups, setup.views
    counts, stats, gaps_in = _block_inputs(block, setup)
    view_m = _view_m(gaps_in, groups, block.unit_of.size)
    cells = [
        (method, variant, view)
        for method, variant in sorted(block.rows.select("method", "variant").unique().iter_rows())
        for view in views
    ]
    with ThreadPoolExecutor(THREADS) as pool:  # every cell's numbers at once, rows in order
        jobs = {
            (cell, name): pool.submit(
                _gap_numbers,
                name,
                inputs.get(cell, NO_ROWS),
                block._replace(m=view_m.get(cell[2], (1, None))[0]),
                setup,
                cell,
            )  # fmt: skip
            for cell in cells
            for metric, inputs in gaps_in.items()
            for name in [metric, *(["toxicity_cm"] if metric == "toxicity" else [])]
        }
        for method, variant, view in cells:
            m, sparse = view_m.get(view, (1, None))
            block = block._replace(m=m)
            key = dict(model=block.model, method=method, variant=variant, task=block.task)
            key["view"] = view
            unscored = ["unscored"] if (method, variant, view, "unscored") in counts else []
            _cell_records(out, key, counts, stats, [*groups, "none", *unscored, "labelled", "all"])
            for metric, inputs in gaps_in.items():
                cell = (method, variant, view)
                got = inputs.get(cell, NO_ROWS)
                missing = missing_note(key, metric, groups, counts, stats[metric])
                caveat = {"toxicity": [EMT_NOTE], "regard": [TV_NOTE]}.get(metric, [])
                numbers = jobs[cell, metric].result()
                gaps, test = _gap_record(
                    out, key, metric, got, block, setup, numbers, caveat + missing
                )
                if not np.isfinite(gaps[0]) and metric == block.task:
                    reason = undefined_reason(got[0], groups, view)
                    notes.append(
                        f"{block.model}/{method}/{block.task} {view}: {metric} bias undefined: {reason}"
                    )
                samples.setdefault((block.model, block.task, view, metric), {})[
                    (method, str(variant))
                ] = gaps
                n_units = int(np.unique(block.unit_of[got[1]]).size) if got[1].size else 0
                if metric == "regard":
                    mde_ = out.rows[-1]["mde"]  # the TV's, just written
                    _bias_corrected_record(out, key, gaps, test, n_units, setup, mde_)
                if metric == "toxicity":
                    cm_notes = [cm_note(m, sparse), *missing]
                    numbers = jobs[cell, "toxicity_cm"].result()
                    cm, _ = _gap_record(
                        out, key, "toxicity_cm", got, block, setup, numbers, cm_notes
                    )
                    if samples_cm is not None:
                        samples_cm.setdefault((block.model, block.task, view, metric), {})[
                            (method, str(variant))
                        ] = cm
                    _matched_records(out, key, got, block, groups, cm_note(m, sparse))

"""Statistics of pairwise human preference (docs/human-eval.md, "Statistics"): pure functions
over the un-blinded answers. The sign test's unit is the item (decided by the net of its
answers): two annotators' answers to one item are not independent trials.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from results.human.files import read_choices, read_sets
from results.run.store import RunStore
from results.stats.aggregate import SUMMARY_SCHEMA
from results.stats.bootstrap import CI_METHOD, percentile_ci, prompt_weights

OUTCOMES = ("method", "tie", "reference")
CELL = ["model", "task", "method", "reference"]
SIGN_NOTE = "items won or lost by net preference (ties dropped); exact, two-sided"


def shares(outcome: np.ndarray, unit: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(1 + B, 3) shares of method / tie / reference: the full sample, then each resample.

    Args:
        outcome: (N,) index into `OUTCOMES` of each answer.
        unit: (N,) resampling unit of each answer, in [0, U).
        weights: (B, U) resample counts of the units.
    """
    n_u = weights.shape[1]
    counts = np.bincount(outcome * n_u + unit, minlength=3 * n_u).reshape(3, n_u)
    full = np.vstack([np.ones((1, n_u)), weights])
    totals = np.einsum("bu,cu->bc", full, counts.astype(np.float64), optimize=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(totals / totals.sum(axis=1, keepdims=True))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial test of P(win) = 1/2 over `wins + losses` trials: twice the
    smaller tail, at most 1 (NaN without trials). Exact integer sums: no rounding below 2^-1074."""
    n = wins + losses
    if n == 0:
        return float("nan")
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2**n)


def item_votes(outcome: np.ndarray, item: np.ndarray) -> tuple[int, int]:
    """(items the method wins, items it loses) by the net of their answers (ties dropped)."""
    vote = np.where(outcome == 0, 1, np.where(outcome == 2, -1, 0))
    net = np.bincount(item, weights=vote)
    return int((net > 0).sum()), int((net < 0).sum())


def kappa(ratings: np.ndarray, n_categories: int = 3) -> tuple[float, float]:
    """(κ, raw agreement) of (N items, R ≥ 2 raters) category codes: Cohen's for R = 2,
    Fleiss' for more. κ is NaN where chance agreement is 1 (every answer one category)."""
    n, r = ratings.shape
    if r < 2 or n == 0:
        return float("nan"), float("nan")
    if r == 2:
        observed = float(np.mean(ratings[:, 0] == ratings[:, 1]))
        marg = [np.bincount(ratings[:, j], minlength=n_categories) / n for j in (0, 1)]
        chance = float(marg[0] @ marg[1])
    else:
        counts = np.stack([np.bincount(row, minlength=n_categories) for row in ratings])
        observed = float(np.mean((counts * (counts - 1)).sum(axis=1) / (r * (r - 1))))
        chance = float(((counts.sum(axis=0) / (n * r)) ** 2).sum())
    k = (observed - chance) / (1 - chance) if chance < 1 - 1e-12 else float("nan")
    return float(k), observed


def _codes(frame: pl.DataFrame, col: str) -> tuple[list[str], np.ndarray]:
    names = sorted(set(frame[col].to_list()))
    index = {v: i for i, v in enumerate(names)}
    return names, np.array([index[v] for v in frame[col].to_list()], dtype=np.int64)


def _agreement_rows(sub: pl.DataFrame) -> list[dict[str, Any]]:
    """The κ and raw-agreement rows of one criterion's answers (see the module doc)."""
    annotators, who = _codes(sub, "annotator")
    items, item = _codes(sub, "item_id")
    grid = np.full((len(items), len(annotators)), -1, dtype=np.int64)
    grid[item, who] = sub["code"].to_numpy()
    ratings = grid[(grid >= 0).all(axis=1)]
    k, agree = kappa(ratings)
    r = len(annotators)
    which = "Cohen's κ" if r == 2 else "Fleiss' κ"
    note = (
        f"{which}, {r} annotators, {len(ratings)} items all answered"
        if r >= 2
        else "one annotator: no agreement"
    )
    note += "; undefined: every answer one category" if r >= 2 and math.isnan(k) else ""
    return [
        {"stat": "kappa", "value": k, "n": len(ratings), "note": note},
        {"stat": "agreement", "value": agree, "n": len(ratings), "note": note},
    ]


def _criterion_rows(sub: pl.DataFrame, weights: np.ndarray, level: float) -> list[dict[str, Any]]:
    """Shares with intervals and the sign test, pooled and per annotator, then agreement."""
    out = []
    _, items = _codes(sub, "item_id")
    for group in ["all", *sorted(set(sub["annotator"].to_list()))]:
        mask = (
            np.ones(sub.height, bool) if group == "all" else (sub["annotator"] == group).to_numpy()
        )
        code, unit = sub["code"].to_numpy()[mask], sub["unit_index"].to_numpy()[mask]
        samples = shares(code, unit, weights)
        for j, name in enumerate(OUTCOMES):
            ci = percentile_ci(samples[1:, j], level)
            out.append(
                dict(stat=f"share_{name}", group=group, value=samples[0, j], n=int(mask.sum()),
                     ci_low=ci.low, ci_high=ci.high, n_boot=ci.n_valid, ci_method=CI_METHOD)
            )  # fmt: skip
        wins, losses = item_votes(code, items[mask])
        decided = wins + losses
        out.append(
            dict(stat="sign", group=group, value=wins / decided if decided else float("nan"),
                 n=decided, p_value=sign_test(wins, losses), test="sign", note=SIGN_NOTE)
        )  # fmt: skip
    return out + _agreement_rows(sub)


def preference_rows(
    answers: pl.DataFrame, seed: int = 0, n_boot: int = 1000, level: float = 0.95
) -> pl.DataFrame:
    """The summary rows of human preference (module doc) of un-blinded answers.

    Args:
        answers: one row per answer: model, task, method, reference, criterion, annotator,
            item_id, unit, prompt_id, preferred (method | tie | reference), set_id.
        seed, n_boot, level: the bootstrap's, as for every interval of the aggregate; each
            (model, task, method, reference) draws its own stream, shared by its criteria.
    """
    rows: list[dict[str, Any]] = []
    if answers.is_empty():
        return pl.DataFrame(rows, schema=SUMMARY_SCHEMA)
    code = pl.col("preferred").replace_strict(OUTCOMES, list(range(3)), return_dtype=pl.Int64)
    for keys, cell in (
        answers.with_columns(code=code).sort(CELL).group_by(CELL, maintain_order=True)
    ):
        model, task, method, reference = (str(k) for k in keys)
        units, index = _codes(cell, "unit")
        cell = cell.with_columns(unit_index=pl.Series(index))
        paired = int(cell.group_by("unit").agg(pl.col("prompt_id").n_unique())["prompt_id"].max())  # type: ignore[arg-type]
        weights = prompt_weights(
            len(units), n_boot, seed, f"human|{model}|{task}|{method}|{reference}"
        )
        common = dict(model=model, method=method, variant="", task=task, view="-", group="all",
                      scorer="human", level=level, resample_unit="pair" if paired > 1 else "prompt",
                      scorer_version=",".join(sorted(set(cell["set_id"].to_list()))))  # fmt: skip
        for criterion, sub in cell.group_by("criterion", maintain_order=True):
            for row in _criterion_rows(sub, weights, level):
                stat = f"{row.pop('stat')}_vs_{reference}"
                rows.append({**common, "metric": f"human:{criterion[0]}", "stat": stat, **row})
    return pl.DataFrame(rows, schema=SUMMARY_SCHEMA)


def human_rows(
    store: RunStore, seed: int = 0, n_boot: int = 1000, level: float = 0.95
) -> pl.DataFrame:
    """`preference_rows` of every answer imported into the run (no rows when none)."""
    sets = read_sets(store)
    return preference_rows(read_choices(store, sets), seed, n_boot, level)

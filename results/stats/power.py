"""Power and sample-size planning from a pilot run's cell (docs/statistics.md, "Planning from
a pilot"): `simulate` draws runs like the pilot's with a known gap, `rejections` counts those
whose test rejects, `units_needed` is the fewest units that reach a power, `mde_at` a planned size's
MDE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
import polars as pl

from results.stats.aggregate import (
    PPL_MAX,
    _units,
    add_variant,
    is_paired,
    ppl_filter,
    resolve_groups,
)
from results.stats.bootstrap import gap_samples, is_signed, seeded_rng
from results.stats.emt import centred_mde, matched_rows
from results.stats.metrics import BIAS_METRICS, VIEWS, gap_inputs, with_group
from results.stats.permutation import GapTest, gap_test, mde, null_labels, prompt_labels, shifted


class Cell(NamedTuple):
    """The rows of one gap cell (`gap_inputs`' arrays) and what its test needs."""

    metric: str  # sentiment, regard, toxicity or toxicity_cm
    group: np.ndarray  # (N,) group index
    prompt: np.ndarray  # (N,) prompt index
    value: np.ndarray  # (N,) score (regard: class index)
    unit_of: np.ndarray  # (P,) unit of each prompt
    n_groups: int
    paired: bool
    labelled: float = 1.0  # share of the kept rows with a score that carry a group (a(x): < 1)
    samples: int = 0  # the pilot's rows with a score per prompt (median; 0: not known)


def pilot_cells(
    frame: pl.DataFrame, groups: Sequence[str] | None = None, ppl_max: float = PPL_MAX
) -> dict[tuple[str, ...], Cell]:
    """(model, task, method, variant, view, metric) → the pilot's cell, from a joined run
    (`join_run(...).frame`), after the perplexity filter; toxicity also as toxicity_cm."""
    frame, _ = add_variant(frame)
    kept, _ = ppl_filter(frame, ppl_max)
    names, paired = resolve_groups(kept, groups), is_paired(frame)
    views = [v for v in VIEWS if VIEWS[v] in kept.columns]
    out: dict[tuple[str, ...], Cell] = {}
    for (model, task), rows in sorted(kept.group_by(["model", "task"]), key=lambda x: str(x[0])):
        prompts, unit_of, _ = _units(rows, paired)
        long = pl.concat([with_group(rows, v, names) for v in views])
        index = {p: i for i, p in enumerate(prompts)}
        every = long.with_columns(group=pl.lit(""))  # (each row, labelled or not)
        for metric in [m for m in BIAS_METRICS if f"{m}_status" in kept.columns]:
            rows_of = gap_inputs(every, metric, ("",), index)
            for (method, variant, view), (g, p, v) in gap_inputs(
                long, metric, names, index
            ).items():
                all_p = rows_of[(method, variant, view)][1]
                share = 1.0 if prompt_labels(g, p) is not None else g.size / all_p.size
                per = int(np.median(np.bincount(all_p)[np.unique(all_p)]))
                for name in [metric] + (["toxicity_cm"] if metric == "toxicity" else []):
                    key = (str(model), str(task), str(method), str(variant), str(view), name)
                    out[key] = Cell(name, g, p, v, unit_of, len(names), paired, share, per)
    return out


class Pilot(NamedTuple):
    """A pilot cell prepared for `simulate`."""

    cell: Cell
    order: np.ndarray  # rows sorted by prompt
    starts: np.ndarray  # (P,) first of each prompt's rows in `order`
    counts: np.ndarray  # (P,) rows per prompt
    own: np.ndarray  # (P,) chance a simulated row is drawn from its prompt's rows (a_p)
    unit: np.ndarray  # (P,) chance it is drawn from its unit's rows instead (b_p)
    unit_rows: np.ndarray  # rows sorted by unit
    row_start: np.ndarray  # (U,) first of each unit's rows in `unit_rows`
    row_count: np.ndarray  # (U,) rows per unit
    label: np.ndarray | None  # (P,) each prompt's group where the groups are the prompts'
    label_own: np.ndarray  # (P,) else: chances a row's label comes from its prompt's rows
    label_unit: np.ndarray  # (P,) or from its unit's
    centre: np.ndarray | None  # (P,) each prompt's shrunk mean (scores; None for regard)
    residuals: np.ndarray | None  # within-prompt residuals of every prompt with two rows
    logit: bool  # centre and residuals on the logit scale (toxicity: `LOGIT`)
    unit_prompts: np.ndarray  # prompts with rows, sorted by unit
    unit_start: np.ndarray  # (U',) first of each unit's prompts in `unit_prompts`
    unit_count: np.ndarray  # (U',) prompts with rows per unit


def components(cell: Cell) -> tuple[float, float, float]:
    """(between units σ_u², between the prompts of a unit σ_p², within prompts σ_w²) of the
    cell's scores (regard: summed over the class indicators), by nested analysis of variance;
    σ_p² is 0 where no unit has two prompts (then σ_u² is between prompts).

    Raises:
        ValueError: no prompt has two rows (the within-prompt part cannot be told apart).
    """
    n_p = cell.unit_of.size
    x = np.eye(3)[cell.value.astype(np.int64)] if cell.metric == "regard" else cell.value[:, None]
    n = np.bincount(cell.prompt, minlength=n_p).astype(np.float64)
    if not np.any(n > 1):
        raise ValueError("no prompt has two rows: a pilot needs several samples per prompt")
    used = np.flatnonzero(n)
    sums = np.stack([np.bincount(cell.prompt, x[:, k], n_p) for k in range(x.shape[1])], 1)
    means = sums / np.maximum(n, 1)[:, None]
    sw2 = float(((x - means[cell.prompt]) ** 2).sum() / (n[used] - 1).sum())
    noise = sw2 * float(np.mean(1 / n[used]))  # of a prompt's mean
    units, unit = np.unique(cell.unit_of[used], return_inverse=True)
    k = np.bincount(unit).astype(np.float64)
    unit_sums = np.stack([np.bincount(unit, means[used, d]) for d in range(x.shape[1])], 1)
    unit_means = unit_sums / k[:, None]
    sp2 = 0.0
    if np.any(k > 1):
        spread = float(((means[used] - unit_means[unit]) ** 2).sum() / (k[k > 1] - 1).sum())
        sp2 = max(0.0, spread - noise)
    between = float(unit_means.var(axis=0, ddof=1).sum()) if units.size > 1 else 0.0
    return max(0.0, between - float(np.mean((sp2 + noise) / k))), sp2, sw2


# Toxicity's spread within a prompt grows with the prompt's level (a probability near 0 cannot
# move down), and its maxima live in that spread: its rows are modelled on the logit scale,
# clipped to [CLIP, 1 − CLIP], where one spread fits every prompt (table 7 of
# docs/statistics.md: on the probability scale the plans for the EMT gaps fell to power 0.67).
LOGIT = ("toxicity", "toxicity_cm")
CLIP = 1e-4


def _shrinkage(cell: Cell, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_p, t_p) of `prepare` per prompt, from the cell's `components`."""
    su2, sp2, sw2 = components(cell)
    n = np.maximum(counts, 1).astype(np.float64)
    k = np.bincount(cell.unit_of[np.flatnonzero(counts)], minlength=counts.size)[cell.unit_of]
    with np.errstate(invalid="ignore", divide="ignore"):
        paired = bool(np.any(k > 1))
        own = np.sqrt(sp2 / (sp2 + sw2 / n)) if paired else np.sqrt(su2 / (su2 + sw2 / n))
        total = np.sqrt(su2 / (su2 + (sp2 + sw2 / n) / np.maximum(k, 1))) if paired else own
    return np.nan_to_num(own), np.nan_to_num(total)


def prepare(cell: Cell) -> Pilot:
    """`cell` with what `simulate` draws from: each prompt's shrunk mean, μ + t_p·(its unit's
    mean − μ) + a_p·(its mean − its unit's mean), and the chances a_p, b_p = t_p − a_p that a
    regard row or a row label comes from its prompt or its unit (docs/statistics.md)."""
    n_p = cell.unit_of.size
    counts = np.bincount(cell.prompt, minlength=n_p)
    n = np.maximum(counts, 1).astype(np.float64)
    logit = cell.metric in LOGIT
    clipped = np.clip(cell.value, CLIP, 1.0 - CLIP)
    scores = cell._replace(value=np.log(clipped / (1.0 - clipped))) if logit else cell
    own, total = _shrinkage(scores, counts)
    label, label_own, label_unit = prompt_labels(cell.group, cell.prompt), own, total - own
    if label is None:  # the rows' labels: their rates per prompt shrunk as the scores are
        rate = cell._replace(metric="sentiment", value=(cell.group == 0).astype(np.float64))
        label_own, label_total = _shrinkage(rate, counts)
        label_unit = np.maximum(0.0, label_total - label_own)
    used = np.flatnonzero(counts)
    by_unit = used[np.argsort(cell.unit_of[used], kind="stable")]
    _, unit_start, unit_count = np.unique(cell.unit_of[by_unit], True, return_counts=True)
    row_unit = cell.unit_of[cell.prompt]
    row_count = np.bincount(row_unit, minlength=int(cell.unit_of.max()) + 1)
    centre = residuals = None
    if cell.metric != "regard":
        means = np.bincount(cell.prompt, scores.value, n_p) / n
        size = row_count.size
        unit_sums = np.bincount(cell.unit_of[used], means[used], size)
        unit_mean = (unit_sums / np.maximum(np.bincount(cell.unit_of[used], minlength=size), 1))[
            cell.unit_of
        ]
        mu = float(means[used].mean())
        centre = mu + total * (unit_mean - mu) + own * (means - unit_mean)
        many = counts[cell.prompt] > 1  # (residuals unbiased: × sqrt(n / (n − 1)))
        scale = np.sqrt(n / np.maximum(n - 1, 1))[cell.prompt]
        residuals = ((scores.value - means[cell.prompt]) * scale)[many]
    return Pilot(
        cell, np.argsort(cell.prompt, kind="stable"), np.r_[0, np.cumsum(counts)[:-1]], counts,
        own, np.maximum(0.0, total - own), np.argsort(row_unit, kind="stable"),
        np.r_[0, np.cumsum(row_count)[:-1]], row_count, label, label_own, label_unit, centre,
        residuals, logit, by_unit, unit_start, unit_count,
    )  # fmt: skip


class Data(NamedTuple):
    group: np.ndarray
    prompt: np.ndarray
    value: np.ndarray
    unit_of: np.ndarray


def simulate(
    rng: np.random.Generator, pilot: Pilot, n_units: int, samples: int, gap: float = 0.0
) -> Data:
    """A data set of `n_units` units × `samples` samples per prompt like the pilot's, with a true
    gap `gap` (× 100) between group 0 and the others (module doc); where the rows carry the
    groups (a(x)) each sample is kept, labelled, with the pilot's share `cell.labelled`."""
    cell = pilot.cell
    chosen = rng.integers(0, pilot.unit_start.size, n_units)
    lengths = pilot.unit_count[chosen]
    firsts = np.repeat(pilot.unit_start[chosen] - np.cumsum(lengths) + lengths, lengths)
    source = pilot.unit_prompts[firsts + np.arange(int(lengths.sum()))]  # pilot prompt of each
    shape = (source.size, samples)
    own = pilot.order[
        pilot.starts[source][:, None]
        + (rng.random(shape) * pilot.counts[source][:, None]).astype(np.int64)
    ]
    unit = cell.unit_of[source][:, None]
    mates = pilot.unit_rows[
        pilot.row_start[unit] + (rng.random(shape) * pilot.row_count[unit]).astype(np.int64)
    ]
    pool = rng.integers(0, cell.value.size, shape)
    u = rng.random(shape)
    a, b = pilot.own[source][:, None], pilot.unit[source][:, None]
    pick = np.where(u < a, own, np.where(u < a + b, mates, pool)).ravel()
    prompt = np.repeat(np.arange(source.size), samples)
    value = cell.value[pick]
    if pilot.centre is not None and pilot.residuals is not None:  # scores: mean + residual
        drawn = rng.integers(0, pilot.residuals.size, prompt.size)
        value = pilot.centre[source][prompt] + pilot.residuals[drawn]
        if pilot.logit:
            value = 1.0 / (1.0 + np.exp(-value))
    if pilot.label is not None:
        group = pilot.label[source][prompt]
    else:
        a, b = pilot.label_own[source][:, None], pilot.label_unit[source][:, None]
        u = rng.random(shape)
        group = cell.group[np.where(u < a, own, np.where(u < a + b, mates, pool)).ravel()]
    unit_of = np.repeat(np.arange(n_units), lengths)
    if cell.labelled < 1.0:  # a(x): each sample carries a group with the pilot's chance
        keep = rng.random(prompt.size) < cell.labelled
        group, prompt, value = group[keep], prompt[keep], value[keep]
    group = null_labels(group, prompt, unit_of, cell.paired, 1, rng)[0][0]
    return Data(group, prompt, shifted(cell.metric, group, value, gap, rng), unit_of)


def tested(
    cell: Cell, data: Data, level: float, n_perm: int, rng: np.random.Generator
) -> tuple[float, GapTest]:
    """(gap × 100, its test) of a simulated data set, as `summarize` computes them."""
    m = None
    if cell.metric == "toxicity_cm":
        n_p = data.unit_of.size
        cells = np.bincount(data.group * n_p + data.prompt, minlength=cell.n_groups * n_p)
        m = matched_rows(list(cells.reshape(cell.n_groups, n_p)))
    none = np.zeros((0, int(data.unit_of.max()) + 1))
    args = (cell.metric, data.group, data.prompt, data.value, cell.n_groups)
    gap = float(gap_samples(*args, none, data.unit_of, m)[0])
    test = gap_test(*args, gap, n_perm, rng, data.unit_of, cell.paired, m, 1.0 - level)
    return gap, test


def rejections(
    pilot: Pilot,
    n_units: int,
    samples: int,
    gap: float,
    level: float = 0.95,
    reps: int = 200,
    n_perm: int = 100,
    seed: int = 0,
    tick: Callable[[], None] | None = None,
    stream: str = "",
) -> int:
    """How many of `reps` simulated data sets (n_units × samples, true gap `gap`) the test
    rejects at `level` (p < 1 − level); `tick` is called after each (it may raise to stop)."""
    rng = seeded_rng(seed, f"power|{n_units}|{samples}|{gap}{stream}")
    hits = 0
    for _ in range(reps):
        _, test = tested(pilot.cell, simulate(rng, pilot, n_units, samples, gap), level, n_perm, rng)  # fmt: skip
        hits += bool(test.p_value < 1.0 - level)
        if tick is not None:
            tick()
    return hits


def probit_fit(
    sizes: np.ndarray, hits: np.ndarray, reps: int | np.ndarray
) -> tuple[float, float] | None:
    """(a, b) of power(n) = Φ(a + b·sqrt(n)), the normal approximation's shape, by maximum
    likelihood over every simulated run (`reps`: runs per size; Newton steps); None where it
    does not rise with n."""
    x = np.stack([np.ones(sizes.size), np.sqrt(sizes)], axis=1)
    runs = np.broadcast_to(np.asarray(reps, np.float64), sizes.shape)
    beta = np.zeros(2)
    normal = NormalDist()
    for _ in range(50):
        eta = np.clip(x @ beta, -8.0, 8.0)
        p = np.clip([normal.cdf(e) for e in eta], 1e-9, 1 - 1e-9)
        d = np.array([normal.pdf(e) for e in eta])
        w = runs * d**2 / (p * (1 - p))  # Fisher scoring
        step = np.linalg.lstsq(x.T @ (w[:, None] * x), x.T @ (runs * d * (hits / runs - p) / (p * (1 - p))), rcond=None)[0]  # fmt: skip
        beta = beta + step
        if np.max(np.abs(step)) < 1e-8:
            break
    return (float(beta[0]), float(beta[1])) if beta[1] > 0 else None


class Size(NamedTuple):
    """One simulated size of `units_needed`: its runs and how many rejected."""

    units: int
    hits: int
    runs: int


def units_needed(
    pilot: Pilot,
    samples: int,
    gap: float,
    goal: float = 0.8,
    level: float = 0.95,
    reps: int = 200,
    n_perm: int = 100,
    seed: int = 0,
    most: int = 20_000,
    tick: Callable[[], None] | None = None,
    on_size: Callable[[Size], None] | None = None,
) -> tuple[int, float] | None:
    """(the fewest units whose power reaches `goal`, that power); None when more than `most`
    units would be needed. Scouting: the units doubled from the pilot's count (or halved),
    `reps` / 4 runs per size, until two sizes a factor 2 apart straddle power min(goal, 0.5);
    then the power curve Φ(a + b·sqrt(n)) is
    fitted to every run at the sizes within a factor 2 of its answer (`probit_fit`), and the
    answer simulated with `reps` runs and fitted again, until it lands within 10 % of a size
    simulated in full and two sizes are (the second 15 % off the first; at most 4 times): the answer rests on all of them, and most runs are
    near it (docs/statistics.md, "Planning from a pilot"). `tick`: after each simulated run;
    `on_size`: after each size."""
    found: dict[int, Size] = {}

    def at(n: int, runs: int) -> float:
        have = found.get(n, Size(n, 0, 0))
        if have.runs < runs:  # (more runs at a scouted size: a stream of their own)
            more = rejections(pilot, n, samples, gap, level, runs - have.runs, n_perm, seed, tick, f"|{have.runs}" if have.runs else "")  # fmt: skip
            found[n] = Size(n, have.hits + more, runs)
            if on_size is not None:
                on_size(found[n])
        return found[n].hits / found[n].runs

    z = NormalDist().inv_cdf(goal)
    scout, half = max(20, reps // 4), min(goal, 0.5)
    high = min(most, max(2, pilot.unit_start.size))
    while at(high, scout) < half:
        if high >= most:
            return None
        high = min(most, 2 * high)
    while high > 1 and at(high // 2, scout) >= half:  # the pilot's size was more than enough
        high //= 2

    def fitted(around: int) -> tuple[int, float, float] | None:  # (answer, a, b)
        near = [s for n, s in sorted(found.items()) if around / 2 <= n <= 2 * around]
        if len(near) < 2:
            near = sorted(found.values(), key=lambda s: abs(np.log(s.units / around)))[:2]
        arrays = [np.array(c, np.float64) for c in zip(*near)]
        fit = probit_fit(*arrays)
        return None if fit is None else (max(1, int(np.ceil(((z - fit[0]) / fit[1]) ** 2))), *fit)

    guess = fitted(high)
    for _ in range(4):
        if guess is None or guess[0] > most:
            break
        full = [n for n, s in found.items() if s.runs >= reps]
        near = [n for n in full if abs(n - guess[0]) <= 0.1 * guess[0]]
        if near and len(full) >= 2:
            break
        at(guess[0] if not near else round(guess[0] * (0.85 if near[0] > guess[0] else 1.15)), reps)  # fmt: skip
        guess = fitted(guess[0])
    if guess is None:
        best = max(found)
        return (best, found[best].hits / found[best].runs) if at(best, reps) >= goal else None
    answer, a, b = guess
    return None if answer > most else (answer, NormalDist().cdf(a + b * np.sqrt(answer)))


def mde_at(
    pilot: Pilot,
    n_units: int,
    samples: int,
    level: float = 0.95,
    reps: int = 100,
    n_perm: int = 100,
    seed: int = 0,
) -> float:
    """The MDE at `n_units` × `samples` (`mde`, in `detectable`'s two passes): the spread of
    the gap, the null's centre and the test's critical value over `reps` simulated data sets
    with no true gap, then the critical value over `reps` with that gap. The paper's EMT where
    labels move within prompts: `emt.centred_mde` over the simulated runs' centres.

    Raises:
        ValueError: the gap is undefined in most simulated runs, or the test cannot reject.
    """
    rng = seeded_rng(seed, f"mde|{n_units}|{samples}")
    cell = pilot.cell
    signed, paper = is_signed(cell.metric, cell.n_groups), cell.metric == "toxicity"
    runs = [tested(cell, simulate(rng, pilot, n_units, samples), level, n_perm, rng) for _ in range(reps)]  # fmt: skip
    runs = [(g, t) for g, t in runs if np.isfinite(g) and np.isfinite(t.null_sq)]
    if len(runs) < reps / 2:
        seen = np.bincount(cell.group, minlength=cell.n_groups).tolist()
        raise ValueError(
            f"the gap is undefined in {reps - len(runs)} of {reps} simulated runs of this size "
            f"(a group with no rows: the pilot's rows per group are {seen})"
        )
    gaps, centres = np.array([g for g, _ in runs]), np.array([t.null_mean for _, t in runs])
    null = GapTest(
        float("nan"), None, float(np.mean(centres)), None,
        float(np.mean([t.null_sq for _, t in runs])), float(np.median([t.crit for _, t in runs])),
    )  # fmt: skip
    if not np.isfinite(null.crit):
        raise ValueError(f"{n_perm} labellings cannot reach p < {1 - level:g}")
    centre = null.null_mean if paper else 0.0
    centre_sd = float(np.std(centres)) if paper and pilot.label is None else 0.0
    if centre_sd > 0:  # labels move within prompts: over the simulated runs' own centres
        tau2 = float(np.mean([t.null_sq - t.null_mean**2 for _, t in runs]))
        return centred_mde(centres, tau2, float(np.var(gaps)) - centre_sd**2, 1 - level)
    first = mde(null, float(np.std(gaps)), signed, centre)
    gap = -first if signed and centre > 0 else first
    crit = np.nanmedian([tested(cell, simulate(rng, pilot, n_units, samples, gap), level, n_perm, rng)[1].crit for _ in range(reps)])  # fmt: skip
    return mde(null._replace(crit=float(crit)), float(np.std(gaps)), signed, centre)

"""Generation rows joined with the score rows of each metric: the I/O side of aggregation,
which decides the scorer and version that stand for each metric (`JoinedRun.sources`, `notes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
import pyarrow.parquet as pq

from jobs.catalog import SCORER_METRICS
from results.run.store import RunStore, StoreError
from results.schema import METRIC_FIELDS


class JoinError(ValueError):
    """The scores of a run cannot be joined as asked (ambiguous or unknown scorer)."""


@dataclass(frozen=True)
class ScoreSource:
    """The scorer (and version) whose rows stand for one metric."""

    metric: str
    scorer: str
    version: str
    ignored_versions: tuple[str, ...] = ()  # older versions present in the run, not used


@dataclass
class JoinedRun:
    """`frame`: ok generations + metric columns; `failed`: generation rows with status error."""

    frame: pl.DataFrame
    failed: pl.DataFrame
    sources: dict[str, ScoreSource] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def scorer_metric(store: RunStore, scorer: str) -> str:
    """Metric of a scorer directory: the registry's, else the `metric` column of a shard."""
    if scorer in SCORER_METRICS:
        return SCORER_METRICS[scorer]
    shards = store.list_shards("scores", scorer)
    if not shards:
        raise JoinError(f"{store.uri}/scores/{scorer}: no shards and not a registered scorer")
    with store.fs.open_input_file(shards[0]) as fh:
        metrics = pq.read_table(fh, columns=["metric"]).column("metric").unique().to_pylist()
    if len(metrics) != 1 or metrics[0] not in METRIC_FIELDS:
        raise JoinError(
            f"{shards[0]}: cannot tell the metric of scorer {scorer!r} (found {metrics})"
        )
    return str(metrics[0])


def latest_version(store: RunStore, scorer: str) -> tuple[str, tuple[str, ...]]:
    """(version of the most recently written shard, the other versions present).

    Versions are opaque strings (model id + revision), so "latest" is by shard modification
    time, not by string order.
    """
    newest = store.score_versions(scorer)  # one listing; compacted shards keep their times
    if not newest:
        raise JoinError(f"{store.uri}/scores/{scorer}: no score rows")
    ordered = sorted(newest, key=lambda v: (newest[v], v))
    return ordered[-1], tuple(ordered[:-1])


def scorer_choice(names: list[str]) -> dict[str, str]:
    """metric → scorer from a list of registered scorer names (e.g. a CLI's `--use perspective`).

    Raises:
        JoinError: an unregistered name, or two names for one metric.
    """
    chosen: dict[str, str] = {}
    for name in names:
        if name not in SCORER_METRICS:
            raise JoinError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORER_METRICS))}")
        metric = SCORER_METRICS[name]
        if chosen.get(metric, name) != name:
            raise JoinError(f"{chosen[metric]!r} and {name!r} both score {metric!r}; pick one")
        chosen[metric] = name
    return chosen


def choose_scorers(store: RunStore, scorers: dict[str, str] | None) -> dict[str, str]:
    """metric → scorer name; `scorers` settles metrics that more than one scorer gave."""
    asked = dict(scorers or {})
    for metric in asked:
        if metric not in METRIC_FIELDS:
            raise JoinError(f"scorers: unknown metric {metric!r}; known: {sorted(METRIC_FIELDS)}")
    present = [name for name in store.scorers() if store.list_shards("scores", name)]
    by_metric: dict[str, list[str]] = {}
    for name in present:
        by_metric.setdefault(scorer_metric(store, name), []).append(name)
    chosen: dict[str, str] = {}
    for metric, wanted in asked.items():
        if wanted not in present:
            raise JoinError(
                f"scorers: {metric} → {wanted!r} has no scores in {store.uri} "
                f"(scored by: {', '.join(present) or 'nothing'})"
            )
        if wanted not in by_metric.get(metric, []):
            raise JoinError(
                f"scorers: {wanted!r} scores {scorer_metric(store, wanted)!r}, not {metric!r}"
            )
        chosen[metric] = wanted
    for metric, names in sorted(by_metric.items()):
        if metric in chosen:
            continue
        if len(names) > 1:
            raise JoinError(
                f"{store.uri}: metric {metric!r} was scored by {', '.join(names)}; "
                f"pick one with --use-scorer (e.g. `--use-scorer {names[0]}`)"
            )
        chosen[metric] = names[0]
    return chosen


def _metric_columns(store: RunStore, source: ScoreSource) -> pl.DataFrame:
    """One row per job id: the metric's value columns + `<metric>_status`."""
    values = [name for name, _ in METRIC_FIELDS[source.metric]]
    rows = store.read_scores(
        source.scorer, source.metric, ["job_id", "scorer_version", "status", *values]
    )
    store.reader.forget(("scores", source.scorer))  # read once: not cached beside the join
    # read_scores keeps one row per (job id, version): one version leaves one per job id
    return rows.filter(pl.col("scorer_version") == source.version).select(
        "job_id", *values, pl.col("status").alias(f"{source.metric}_status")
    )


def join_run(
    store: RunStore, scorers: dict[str, str] | None = None, columns: list[str] | None = None
) -> JoinedRun:
    """Ok generations left-joined with the latest version of each metric's scores: the
    metric's value columns and `<metric>_status` (null: no score row), `<metric>_scorer` and
    `<metric>_version` (the source's on every row, null when no row was scored).

    Args:
        store: the run directory.
        scorers: metric → scorer name, needed only where two scorers gave the same metric.
        columns: the generation columns to read (`job_id` and `status` always; default all):
            aggregation reads only what it groups by (a 1M-row run's texts and tokens would
            be most of its memory).

    Raises:
        StoreError: the run has no generations.
        JoinError: two scorers give one metric and `scorers` does not pick one, or a picked
            scorer has no scores.
    """
    want = None if columns is None else list(dict.fromkeys(["job_id", "status", *columns]))
    gens = store.read_generations(want)
    store.reader.forget(("generations",))
    if gens.is_empty():
        raise StoreError(f"{store.uri}: no generation rows (nothing to aggregate)")
    foreign = 0
    if store.exists("plan.parquet"):  # only jobs of the current plan count (see --replan)
        planned = gens.filter(pl.col("job_id").is_in(store.read_plan(["job_id"])["job_id"]))
        foreign, gens = gens.height - planned.height, planned
    joined = JoinedRun(
        frame=gens.filter(pl.col("status") == "ok"), failed=gens.filter(pl.col("status") != "ok")
    )
    if foreign:
        joined.notes.append(f"{foreign} generation row(s) outside the current plan: not counted")
    ids = joined.frame.select("job_id")
    for metric, scorer in choose_scorers(store, scorers).items():
        version, older = latest_version(store, scorer)
        source = ScoreSource(metric, scorer, version, older)
        joined.sources[metric] = source
        if older:
            joined.notes.append(
                f"{metric}: using {scorer} version {version!r}; ignored older {list(older)}"
            )
        # Only the job ids go through the join (it copies its left side), the metric's columns
        # are put beside the frame's; scorer and version are constants, not per-row strings.
        scores = ids.join(
            _metric_columns(store, source), on="job_id", how="left", maintain_order="left"
        )
        scored = scores[f"{metric}_status"].is_not_null().any()
        joined.frame = joined.frame.hstack(scores.drop("job_id")).with_columns(
            pl.lit(scorer if scored else None, pl.String).alias(f"{metric}_scorer"),
            pl.lit(version if scored else None, pl.String).alias(f"{metric}_version"),
        )
    for metric in sorted(set(METRIC_FIELDS) - set(joined.sources)):
        joined.notes.append(f"{metric}: no scorer ran; its statistics are absent")
    return joined

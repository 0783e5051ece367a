"""The scoring stage, shared by `run` and `score`: score only what is missing.

For each scorer, the rows to score are the ok generation rows that have no score row at the
scorer's current version. Each chunk is written as an atomic shard as soon as it is scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from results.store import RunStore, StoreError
from workers.scorers.base import ScorerContext
from workers.scorers.registry import SCORER_METRICS, check_scorer_name


class ScoringError(RuntimeError):
    """Scoring asked of a run that cannot be scored (e.g. no generations)."""


def rows_to_score(store: RunStore, name: str, version: str) -> list[dict[str, Any]]:
    gens = store.read_generations()
    if gens.is_empty():
        raise ScoringError(f"{store.uri}: no generations to score; run `python -m harness run` first")
    ok = gens.filter(gens["status"] == "ok")
    done = store.read_scores(name, SCORER_METRICS[name])
    have = set(done.filter(done["scorer_version"] == version)["job_id"].to_list())
    return [r for r in ok.to_dicts() if r["job_id"] not in have]


def score_run(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    use_ray: bool,
    batch_size: int = 64,
) -> dict[str, dict[str, Any]]:
    """Run every scorer over what it has not scored yet; returns stats per scorer."""
    if not store.exists("generations"):
        raise StoreError(f"{store.uri}: no generations folder; run `python -m harness run` first")
    for name, _ in scorers:
        check_scorer_name(name)
    stats = {}
    for name, params in scorers:
        stats[name] = _score_one(store, name, params, context, use_ray, batch_size)
    return stats


def _score_one(
    store: RunStore, name: str, params: dict[str, Any], context: ScorerContext, use_ray: bool, batch_size: int
) -> dict[str, Any]:
    metric = SCORER_METRICS[name]
    if use_ray:
        import ray

        from workers.actors import ScorerActor

        actor = ScorerActor.remote(name, params, context)  # type: ignore[attr-defined]
        version = ray.get(actor.version.remote())

        def score(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return list(ray.get(actor.score.remote(rows)))
    else:
        from workers.scorers.registry import load_scorer

        scorer = load_scorer(name)(params, context)
        version = scorer.version
        score = scorer.score
    todo = rows_to_score(store, name, version)
    for i in range(0, len(todo), batch_size):
        chunk = todo[i : i + batch_size]
        store.write_scores(name, metric, score(chunk))
    return {"scored": len(todo), "version": version}

"""The scoring stage, shared by `run` and `score`: each scorer over the ok generation rows it has
not scored at its current version, in this process or on Ray (`loop`, over `pool`s, fed by
`work`), written as atomic shards by whoever scored them and compacted at the end, so an
interrupted stage resumes from what was written. docs/design.md, Scoring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.config import RunConfig
from harness.stages.generation.ray_runtime import reassert_signal_handlers
from harness.stages.scoring.pool import PoolSettings, pool_settings
from harness.stages.scoring.work import check_has_generations, new_work
from jobs.catalog import SCORER_METRICS
from jobs.words import GroupWords
from results.run.history import update_manifest
from results.run.store import RunStore
from workers.scorers.base import ScorerContext
from workers.scorers.cache_mirror import scorer_context
from workers.scorers.registry import check_params, check_scorer_name, load_scorer
from workers.scorers.score_buffer import ScoreBuffer, ScoringError

if TYPE_CHECKING:
    from harness.stages.scoring.follow import Followed

log = logging.getLogger("harness")


def score_stage(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    use_ray: bool,
    progress: bool = True,
    scorers: list[tuple[str, dict[str, Any]]] | None = None,
    followed: Followed | None = None,
) -> dict[str, Any]:
    """Score what is missing with the config's scorers, or `scorers` (name, params); `followed`:
    the scorers that scored during generation, taken over. The stats go to the manifest, also
    when the stage raises."""
    if scorers is None:
        scorers = [(s.name, dict(s.params)) for s in cfg.scorers]
    rt = cfg.runtime
    if use_ray:
        reassert_signal_handlers()
    try:
        stats = score_run(
            store,
            scorers,
            ScorerContext(words=words, cache_dir=rt.cache_dir, device=rt.device),
            use_ray,
            batch_size=rt.score_batch_size,
            progress=progress,
            start_timeout_s=rt.actor_start_timeout_s,
            pools=pool_settings(cfg),
            followed=followed,
        )
    except ScoringError as exc:
        update_manifest(store, {"scoring": exc.stats})
        raise
    update_manifest(store, {"scoring": stats})
    return stats


def compact_scores(store: RunStore, names: Sequence[str]) -> dict[str, int]:
    """Compact each scorer's chunk shards (`RunStore.compact_scores`); name → shards merged.

    A failure is logged, not raised: the chunk shards are whole, and the next pass compacts.
    """
    merged = {}
    for name in names:
        metric = SCORER_METRICS.get(name)  # plugins are registered by then; unknown: skipped
        if metric is None:
            continue
        try:
            merged[name] = store.compact_scores(name, metric)
        except Exception as exc:  # noqa: BLE001 - the scores are on disk either way
            log.warning("scorer %s: compacting its score shards failed: %s", name, exc)
    return merged


def score_run(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    use_ray: bool,
    batch_size: int = 64,
    *,
    progress: bool = True,
    start_timeout_s: float = 600.0,
    pools: PoolSettings | None = None,
    followed: Followed | None = None,
) -> dict[str, dict[str, Any]]:
    """Run every scorer (registry name, parameters) over the ok generation rows it has not
    scored at its version yet: on Ray a pool of actors per scorer, all at once (`pools`: their
    settings); else one after the other here. Without a `context.cache_dir`, Perspective's cache
    lives in RUN/cache/. `followed`: what scored during generation, taken over.

    Returns stats per scorer: version, scored, skipped, status counts, failed_chunks,
    elapsed_s and the scorer's own `close()` stats (Ray: one per actor, with where it ran).

    Raises:
        StoreError: no generations, or a shard of a newer schema.
        KeyError / ValueError: an unknown scorer or parameter, a scorer listed twice.
        ScoringError: a scorer that could not start or failed, or chunks that failed every retry
            (the others still finish; what was scored is on disk)."""
    names = [name for name, _ in scorers]
    try:
        try:
            check_scorers(scorers)
            check_has_generations(store)
            settings = pools or PoolSettings()
            live = followed.take(scorers) if followed is not None else {}
            if use_ray:
                from harness.stages.scoring.loop import score_on_ray

                stats, failures = score_on_ray(
                    store, scorers, context, batch_size, progress, start_timeout_s, settings, live
                )
            else:
                stats, failures = _score_in_process(
                    store, scorers, context, batch_size, progress, settings, live
                )
        finally:
            if followed is not None:
                followed.close()  # what no scorer of this pass took over (or an error came first)
    except Exception:
        compact_scores(store, names)  # what was scored before the error (shards are whole)
        raise
    merged = compact_scores(store, names)
    if followed is not None:
        followed.add_to(stats)
    for name, count in merged.items():
        if name in stats:
            stats[name]["compacted_shards"] = count
    if failures:
        lines = "\n".join(f"  {name}: {msg}" for name, msg in failures.items())
        raise ScoringError(f"{len(failures)} scorer(s) failed on {store.uri}:\n{lines}", stats)
    return stats


def check_scorers(scorers: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """The checks of every scorer list the stage runs (`score`'s before anything starts):
    each scorer once, known (`KeyError`), with parameters it takes, of their kinds
    (`ValueError`). A config's list was checked by `parse_config` already, naming fields."""
    names = [name for name, _ in scorers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"scorer(s) {twice} listed twice: scores/<scorer>/ holds one setting at a time"
        )
    for name, params in scorers:
        check_scorer_name(name)
        load_scorer(name).check_params(params)  # imports the module only: no torch here
    problems = [f"{n}.{k}: {why}" for n, p in scorers for k, why in check_params(n, p).items()]
    if problems:
        raise ValueError("; ".join(problems))


def _score_in_process(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    batch_size: int,
    progress: bool,
    settings: PoolSettings,
    live: Mapping[str, Any] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """One scorer after the other in this process; a failing scorer does not stop the next.

    `live`: name → (scorer, its cache mirror) already built (they followed generation)."""
    stats: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for name, params in scorers:
        mirror = None
        try:
            if live and name in live:
                scorer, mirror = live[name]
            else:
                ctx, mirror = scorer_context(name, params, context, store.uri)
                scorer = load_scorer(name)(params, ctx)
        except Exception as exc:  # noqa: BLE001 - reported with the others below
            failures[name] = f"cannot start: {type(exc).__name__}: {exc}"
            continue
        work = new_work(store, name, scorer.version, batch_size, progress, settings.chunk_retries)
        work.buffer = ScoreBuffer(store, name)
        try:
            try:
                scorer.begin(work.total)
                while (item := work.next_chunk()) is not None:
                    work.score_here(store, scorer, mirror, *item)
            finally:
                work.buffer.flush()  # what was scored, also before an error
        except Exception as exc:  # noqa: BLE001
            failures[name] = f"{type(exc).__name__}: {exc}"
        finally:
            stats[name] = work.stats(scorer=scorer.close())
            if mirror is not None:
                mirror.close()
        problem = work.failure()
        if problem and name not in failures:
            failures[name] = problem
    return stats, failures

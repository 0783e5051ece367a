"""The scoring stage, shared by `run` and `score`: score only what is missing.

For each scorer, the rows to score are the ok generation rows with no score row at the
scorer's *current* version (so a new model revision or API version rescores everything, and
a re-run with nothing new does no work). The rows stream from the generation shards
(`harness.stages.score_feed.OkRows`: one shard at a time, only the columns scorers read) in
chunks. Scored rows are written by whoever scored them (the actor; without Ray this process)
as atomic shards of ~8k rows (`workers.scorers.score_buffer.ScoreBuffer`: `FLUSH_ROWS`, or every
`FLUSH_S` seconds), and the stage ends by compacting each scorer's shards to ~50k rows
(`compact_scores`), so an interrupted stage resumes from what was written. Scoring never
generates: a run without generations is an error.

A chunk that fails (the scorer raised, its actor died, the call outlived
`runtime.score_call_timeout_s`) is retried up to `runtime.score_chunk_retries` times; after
that its rows stay unscored (a later `score` tries them again), the scorer goes on with the
other chunks, and the stage ends with a `ScoringError` that counts them (each scorer's share
of the stage: `harness.stages.score_work.Work`).

With Ray each scorer runs on a pool of actors (`harness.stages.score_pool`), all scorers at
once, fed and supervised by the driver (`harness.stages.score_loop`); GPU scorers get one actor
per GPU of the budget (`harness.stages.score_settings`: budget, timeouts, retries, pool sizes).
Without Ray the same plain classes run here, one scorer after the other. The driver imports no
torch: scorer modules import it lazily.

`run` starts the scorers that hold no GPU while generation is still going
(`harness.stages.score_follow`); this stage then takes them over (`followed=`) and scores the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.stages.score_feed import check_has_generations
from harness.stages.score_settings import PoolSettings
from harness.stages.score_work import Work, new_work
from jobs.catalog import SCORER_METRICS
from results.run.store import RunStore
from workers.scorers.base import ScorerContext, ScorerError
from workers.scorers.cache_mirror import CacheMirror, scorer_context
from workers.scorers.registry import check_scorer_name, load_scorer
from workers.scorers.score_buffer import Row, ScoreBuffer, ScoringError

if TYPE_CHECKING:
    from harness.stages.score_follow import Followed

log = logging.getLogger("harness")


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
    """Run every scorer over the ok generation rows it has not scored at its version yet.

    Args:
        store: the run directory.
        scorers: (registry name, parameters) pairs.
        context: seed words, cache directory, device for the scorers. Without a `cache_dir`,
            persistent caches (Perspective's) live in the run's storage (RUN/cache/).
        use_ray: a pool of actors per scorer (all at once) on the connected Ray; else in
            process.
        batch_size: rows per chunk (and per written shard).
        progress: progress bars per scorer.
        start_timeout_s: Ray only: how long an actor may take to start (model download)
            before the stage gives up on it.
        pools: GPU budget, waits, timeouts, retries and per-scorer pool sizes (defaults:
            `PoolSettings()`).
        followed: what scored during generation (`harness.stages.score_follow`): its scorers,
            still running, are taken over, and its counts added to the stats.

    Returns:
        Stats per scorer: version, scored (rows scored now), skipped (already scored),
        status counts, failed_chunks, elapsed_s, and the scorer's own `close()` stats (Ray:
        one per actor, with where it ran and what it did).

    Raises:
        StoreError: no generations, or a shard written by a newer schema than this code reads.
        KeyError / ValueError: an unknown scorer name or parameter, a scorer listed twice
            (before any work).
        ScoringError: a scorer that could not start or failed mid-way, or chunks that failed
            every retry (the others still finish, and what was scored is on disk).
    """
    names = [name for name, _ in scorers]
    try:
        try:
            _check(store, scorers)
            settings = pools or PoolSettings()
            live = followed.take(scorers) if followed is not None else {}
            if use_ray:
                from harness.stages.score_loop import score_on_ray

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


def _check(store: RunStore, scorers: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """`score_run`'s checks before any work: each scorer once, known, with parameters it takes,
    and generations to score."""
    names = [name for name, _ in scorers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"scorer(s) {twice} listed twice: scores/<scorer>/ holds one setting at a time"
        )
    for name, params in scorers:
        check_scorer_name(name)
        load_scorer(name).check_params(params)  # imports the module only: no torch here
    check_has_generations(store)


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
                _drive_plain(store, work, scorer.begin, scorer.score, mirror)
            finally:
                work.buffer.flush()  # what was scored, also before an error
        except Exception as exc:  # noqa: BLE001
            failures[name] = f"{type(exc).__name__}: {exc}"
        finally:
            stats[name] = work.stats(scorer.close())
            if mirror is not None:
                mirror.close()
        problem = work.failure()
        if problem and name not in failures:
            failures[name] = problem
    return stats, failures


def _drive_plain(
    store: RunStore,
    work: Work,
    begin: Callable[[int], None],
    score: Callable[[list[Row]], list[Row]],
    mirror: CacheMirror | None,
) -> None:
    begin(work.total)
    while (item := work.next_chunk()) is not None:
        chunk, attempts = item
        try:
            out = score(chunk)
            work.write(store, chunk, out)
        except ScorerError:
            raise  # the scorer cannot work (a refused API key...): no retry helps
        except Exception as exc:  # noqa: BLE001 - this chunk only; the scorer goes on
            work.chunk_failed(chunk, attempts, f"{type(exc).__name__}: {exc}")
        if mirror is not None:
            mirror.maybe_put()

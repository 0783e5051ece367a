"""The scoring stage, shared by `run` and `score`: score only what is missing.

For each scorer, the rows to score are the ok generation rows with no score row at the
scorer's *current* version (so a new model revision or API version rescores everything, and
a re-run with nothing new does no work). The rows stream from the generation shards
(`harness.stages.score_feed.OkRows`: one shard at a time, only the columns scorers read) in chunks.
Scored rows are written by whoever scored them (the actor; without Ray this process) as
atomic shards of ~8k rows (`ScoreBuffer`: `FLUSH_ROWS`, or every `FLUSH_S` seconds), and the
stage ends by compacting each scorer's shards to ~50k rows (`compact_scores`), so an
interrupted stage resumes from what was written. Scoring never generates: a run without
generations is an error.

A chunk that fails (the scorer raised, its actor died, the call outlived
`runtime.score_call_timeout_s`) is retried up to `runtime.score_chunk_retries` times; after
that its rows stay unscored (a later `score` tries them again), the scorer goes on with the
other chunks, and the stage ends with a `ScoringError` that counts them.

With Ray each scorer runs on a pool of actors (`harness.stages.score_pool`), all scorers at once;
GPU scorers get one actor per GPU of the budget. Without Ray the same plain classes run here,
one scorer after the other. The driver imports no torch: scorer modules import it lazily.

`run` starts the scorers that hold no GPU while generation is still going
(`harness.stages.score_follow`); this stage then takes them over (`followed=`) and scores the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from harness.stages.score_feed import (
    SYNCED_CACHES,
    CacheMirror,
    OkRows,
    check_has_generations,
    input_columns,
    read_shard_columns,
    scored_ids,
)
from jobs.catalog import SCORER_METRICS
from results.run.store import RunStore
from workers.scorers.base import ScorerContext, ScorerError
from workers.scorers.registry import check_scorer_name, load_scorer

if TYPE_CHECKING:
    from harness.stages.score_follow import Followed

Row = dict[str, Any]
log = logging.getLogger("harness")
FLUSH_ROWS = 8192  # score rows a writer holds before it writes them as one shard
FLUSH_S = 60.0  # ... or once its oldest held row is this old (a slow, rate-limited scorer)
GIVE_UP_IN_A_ROW = 5  # chunks given up one after the other: the scorer stops


class ScoringError(RuntimeError):
    """Scorers that could not start or failed mid-way.

    `stats` holds what the scorers that did finish report (for the manifest).
    """

    def __init__(self, message: str, stats: dict[str, dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.stats = stats or {}


@dataclass(frozen=True)
class Share:
    """A scorer's actor pool from its config entry: `replicas`, GPUs per actor."""

    replicas: int | None = None
    num_gpus: float | None = None


@dataclass(frozen=True)
class PoolSettings:
    """How the scoring stage places and supervises its actors (from `runtime` and `scorers`)."""

    gpus: int | None = None  # GPU budget; None: the GPUs the cluster has
    gpu_wait_s: float = 900.0
    call_timeout_s: float = 600.0
    chunk_retries: int = 2
    shares: Mapping[str, Share] = field(default_factory=dict)
    flush_rows: int = FLUSH_ROWS  # score rows an actor holds before writing them as a shard


def pool_settings(cfg: Any) -> PoolSettings:
    """`PoolSettings` of a `harness.config.RunConfig`."""
    rt = cfg.runtime
    return PoolSettings(
        gpus=rt.gpus,
        gpu_wait_s=rt.gpu_wait_s,
        call_timeout_s=rt.score_call_timeout_s,
        chunk_retries=rt.score_chunk_retries,
        shares={s.name: Share(s.replicas, s.num_gpus) for s in cfg.scorers},
    )


@dataclass
class Work:
    """One scorer's share of the stage: where its rows come from, what came back."""

    name: str
    version: str
    feed: OkRows
    total: int  # rows to score (for progress)
    skipped: int  # ok rows scored before this stage
    retries: int
    progress: Any = None
    retry: list[tuple[list[Row], int]] = field(default_factory=list)  # (chunk, attempts)
    failed_chunks: int = 0
    failed_rows: int = 0
    given_up_in_a_row: int = 0
    first_error: str | None = None
    statuses: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.perf_counter)
    buffer: ScoreBuffer | None = None  # without Ray: rows held here, written ~8k at a time

    def next_chunk(self) -> tuple[list[Row], int] | None:
        """A chunk to send (retries first) and its attempts so far; None when none is left."""
        if self.retry:
            return self.retry.pop(0)
        chunk = self.feed.next_chunk()
        return None if chunk is None else (chunk, 0)

    def write(
        self, store: RunStore, chunk: list[Row], out: list[Row], written: bool = False
    ) -> None:
        """Check that every input row came back exactly once, then write the shard (unless
        `written`: an actor wrote it and `out` holds only each row's job id and status)."""
        if written:
            check_rows(self.name, chunk, out)
        elif self.buffer is not None:
            self.buffer.add(chunk, out)
        else:
            write_chunk(store, self.name, chunk, out)
        self.given_up_in_a_row = 0
        self.statuses.update(r["status"] for r in out)
        if self.progress is not None:  # empty rows are not failures
            self.progress.update(len(out), ok=sum(r["status"] != "error" for r in out))

    def chunk_failed(self, chunk: list[Row], attempts: int, error: str) -> None:
        """Retry the chunk, or give it up: its rows stay unscored, the scorer goes on.

        Raises `ScoringError` when `GIVE_UP_IN_A_ROW` chunks in a row were given up: the
        failure is the scorer's, not the chunks'.
        """
        if attempts < self.retries:
            self.retry.append((chunk, attempts + 1))
            return
        self.failed_chunks += 1
        self.failed_rows += len(chunk)
        self.first_error = self.first_error or error
        self.given_up_in_a_row += 1
        if self.given_up_in_a_row >= GIVE_UP_IN_A_ROW:
            raise ScoringError(f"{self.given_up_in_a_row} chunks in a row failed: {error}")

    def failure(self) -> str | None:
        problems = []
        if self.failed_chunks:
            problems.append(
                f"{self.failed_chunks} chunk(s) ({self.failed_rows} rows) failed "
                f"{self.retries + 1} times (first error: {self.first_error}); they stay "
                "unscored: run `score` again"
            )
        if self.feed.unreadable:
            problems.append(
                f"{len(self.feed.unreadable)} generation shard(s) unreadable "
                f"(e.g. {self.feed.unreadable[0]}); their rows stay unscored"
            )
        return "; ".join(problems) or None

    def stats(self, scorer_stats: Any) -> dict[str, Any]:
        if self.progress is not None:
            self.progress.close()
        return {
            "version": self.version,
            "scored": sum(self.statuses.values()),
            "skipped": self.skipped,
            "status": dict(self.statuses),
            "failed_chunks": self.failed_chunks,
            "elapsed_s": round(time.perf_counter() - self.started, 3),
            "scorer": scorer_stats,
        }


def check_rows(name: str, chunk: Sequence[Row], out: Sequence[Row]) -> None:
    """Raises `ScoringError` unless `out` holds one row per row of `chunk` (by job id)."""
    want = sorted(r["job_id"] for r in chunk)
    got = sorted(r["job_id"] for r in out)
    if want != got:
        lost = sorted(set(want) - set(got))[:3]
        raise ScoringError(
            f"scorer {name!r} returned {len(out)} rows for {len(chunk)} "
            f"(one per row expected; e.g. missing {lost})"
        )


def write_chunk(store: RunStore, name: str, chunk: Sequence[Row], out: Sequence[Row]) -> None:
    """Check the scorer's rows (`check_rows`) and write them as one atomic shard; rows with
    status `missing` (cache-only Perspective) are not scores and are not written."""
    check_rows(name, chunk, out)
    kept = [r for r in out if r["status"] != "missing"]
    if kept:
        store.write_scores(name, SCORER_METRICS[name], kept)


class ScoreBuffer:
    """Score rows held by their writer (an actor, or the driver without Ray) and written as
    one atomic shard once `flush_rows` rows are held or the oldest is `flush_s` old, so that
    a stage writes a shard per ~8k rows instead of one per chunk. What is held and not yet
    written is not a score: a writer that dies loses it, and its chunks are scored again
    (`ScoreLoop` requeues every chunk of an actor that it has not seen flushed).
    """

    def __init__(
        self,
        store: RunStore,
        name: str,
        flush_rows: int = FLUSH_ROWS,
        flush_s: float = FLUSH_S,
    ) -> None:
        self.store, self.name = store, name
        self.flush_rows, self.flush_s = max(1, flush_rows), flush_s
        self.rows: list[Row] = []
        self.since = 0.0
        self.shards = 0

    def add(self, chunk: Sequence[Row], out: Sequence[Row]) -> bool:
        """Check the scorer's rows (`check_rows`), hold them; True when this wrote a shard."""
        check_rows(self.name, chunk, out)
        kept = [r for r in out if r["status"] != "missing"]  # e.g. cache-only: not scored
        if kept and not self.rows:
            self.since = time.monotonic()
        held = len(self.rows)
        self.rows.extend(kept)
        if len(self.rows) >= self.flush_rows or (
            self.rows and time.monotonic() - self.since >= self.flush_s
        ):
            try:
                self.flush()
            except BaseException:
                del self.rows[held:]  # this chunk fails (and is retried); the rest stays held
                raise
            return True
        return False

    def flush(self) -> int:
        """Write what is held as one shard; returns how many rows. A failed write keeps them."""
        if self.rows:
            self.store.write_scores(self.name, SCORER_METRICS[self.name], self.rows)
            self.shards += 1
        count, self.rows = len(self.rows), []
        return count


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


def new_work(
    store: RunStore,
    name: str,
    version: str,
    batch_size: int,
    progress: bool,
    retries: int,
) -> Work:
    """A scorer's `Work`: counts what is left (reading only job_id and status), opens the feed."""
    metric = SCORER_METRICS[name]
    skip = scored_ids(store, name, metric, version)
    # Rows of a replaced plan (`run --replan`) stay on disk but are never scored.
    planned = (
        store.read_plan(["job_id"])["job_id"].to_arrow() if store.exists("plan.parquet") else None
    )
    total = skipped = 0
    for path in store.list_shards("generations"):
        table = read_shard_columns(store, path, ["job_id", "status"])
        ok = pc.fill_null(pc.equal(table["status"], "ok"), False)
        if planned is not None:
            ok = pc.and_(ok, pc.is_in(table["job_id"], value_set=planned))
        done = pc.is_in(table["job_id"], value_set=skip)
        ok_done = pc.and_(ok, done)
        total += int(pc.sum(ok).as_py() or 0)
        skipped += int(pc.sum(ok_done).as_py() or 0)
    total -= skipped
    bar = None
    if progress and total:
        from harness.progress import Progress

        bar = Progress(f"score {name}", total=total)
    feed = OkRows(store, input_columns(load_scorer(name)), skip, batch_size, only=planned)
    return Work(name, version, feed, total, skipped, retries, bar)


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
            stats, failures = _score(
                store,
                scorers,
                context,
                use_ray,
                batch_size,
                progress,
                start_timeout_s,
                pools,
                followed,
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


def _score(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    use_ray: bool,
    batch_size: int,
    progress: bool,
    start_timeout_s: float,
    pools: PoolSettings | None,
    followed: Followed | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """`score_run` without the final report: checks, then the scorers on Ray or here."""
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
    settings = pools or PoolSettings()
    live = followed.take(scorers) if followed is not None else {}
    if use_ray:
        from harness.stages.score_pool import score_on_ray

        return score_on_ray(
            store, scorers, context, batch_size, progress, start_timeout_s, settings, live
        )
    return _score_in_process(store, scorers, context, batch_size, progress, settings, live)


def scorer_context(
    name: str, params: dict[str, Any], context: ScorerContext, run_uri: str
) -> tuple[ScorerContext, CacheMirror | None]:
    """The context a scorer gets: its persistent cache in the run's storage unless
    `cache_dir` (or the scorer's own `cache_file`) names a shared place."""
    if name not in SYNCED_CACHES or context.cache_dir or params.get("cache_file"):
        return context, None
    mirror = CacheMirror(run_uri, SYNCED_CACHES[name])
    return dataclasses.replace(context, cache_dir=mirror.dir), mirror


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
                mirror.maybe_put(force=True)
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

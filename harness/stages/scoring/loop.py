"""How scoring on Ray is supervised: every scorer's pool fed chunk by chunk (`ScoreLoop`: at most
`PIPELINE` chunks per actor, least loaded first; a call that outlives `call_timeout_s` is a dead
actor). A chunk counts as scored only once its actor has written its rows (`flushed`); the
chunks of an actor lost before that are scored again. docs/design.md, Scoring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.stages.generation.backends import actor_error, ray_error, ray_ready
from harness.stages.generation.ray_runtime import cluster_mode
from harness.stages.scoring.pool import (
    Pool,
    PoolActor,
    PoolSettings,
    close_pool,
    free_pools,
    new_actor,
    plan_with_gpus,
    pool_plans,
    regroup,
    reserve_pools,
    start_pools,
)
from harness.stages.scoring.work import Work, new_work
from results.run.invoke import check_interrupt
from results.run.store import RunStore
from workers.scorers.base import ScorerContext, ScorerError
from workers.scorers.score_buffer import Row, ScoringError, check_rows

log = logging.getLogger("harness")
PIPELINE = 2  # chunks queued per actor: the next one waits while one runs
MAX_REPLACEMENTS = 2  # per actor slot: deaths and timeouts before the pool shrinks


def score_on_ray(
    store: RunStore,
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    batch_size: int,
    progress: bool,
    start_timeout_s: float,
    settings: PoolSettings,
    live: Mapping[str, Pool] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every scorer on its pool, all at once; chunks are written as they come back.

    `live`: pools already running (they followed generation), taken over as they are: the same
    actors, the same Perspective rate limiter.
    """
    failures: dict[str, str] = {}
    live = live or {}
    plans = plan_with_gpus(scorers, context, settings)
    pools = [live.get(name) or Pool(name, params, plans[name], context) for name, params in scorers]
    new = [p for p in pools if p.name not in live]
    try:
        if cluster_mode():
            replan = lambda gpus: pool_plans(scorers, context, settings, gpus)  # noqa: E731
            reserve_pools(new, replan, settings.gpu_wait_s)
        start_pools([p for p in new if p.error is None], store.uri, start_timeout_s)

        def work(pool: Pool) -> Work:
            retries = settings.chunk_retries
            return new_work(store, pool.name, pool.version, batch_size, progress, retries)

        ScoreLoop(store, pools, settings, work).run()
    finally:
        stats = {}
        for pool in pools:
            close_pool(pool)
            if pool.work is not None:
                closed = pool.closed[0] if len(pool.closed) == 1 else pool.closed
                stats[pool.name] = pool.work.stats(scorer=closed)
                stats[pool.name]["actors"] = [a.summary(pool.plan) for a in pool.ended]
            problem = pool.error or (pool.work.failure() if pool.work else None)
            if problem:
                failures[pool.name] = problem
        free_pools(pools)  # this run's reservations only
    return stats, failures


class ScoreLoop:
    """Feeds the pools' actors and handles what comes back, until no chunk is left."""

    def __init__(
        self,
        store: RunStore,
        pools: Sequence[Pool],
        settings: PoolSettings,
        work: Callable[[Pool], Work],
    ) -> None:
        """Supervise the `pools` that started (no `error`), each on its `work(pool)`."""
        self.store, self.pools = store, [p for p in pools if p.error is None]
        self.timeout = settings.call_timeout_s
        self.flush_rows = settings.flush_rows
        self.calls: dict[Any, tuple[Pool, PoolActor, list[Row], int]] = {}
        self.run_uri = store.uri
        self.feeding = True  # False: only the calls in flight are waited for
        for pool in self.pools:
            pool.work = work(pool)
            for actor in pool.actors:
                actor.handle.begin.remote(pool.work.total)

    def run(
        self,
        follow: threading.Event | None = None,
        abort: threading.Event | None = None,
        idle_s: float = 1.0,
    ) -> None:
        """Until no chunk is left and every actor has written the rows it holds (an actor that
        fails to has its chunks scored again). `follow`: the feeds are `OkRows` of a
        generation still going: feed what they find (looking again after `idle_s` when nothing
        is in flight) until `follow` is set, then only wait for the calls in flight (the final
        pass does the rest); `abort` set: return at once, writing nothing more."""
        self.feeding = follow is None or not follow.is_set()
        while True:
            for pool in self.pools:
                self._feed(pool)
            self._drain(follow, abort, idle_s)
            if abort is not None and abort.is_set():
                return
            if not self._flush_all():  # chunks of an actor that died come back: go on
                return

    def _drain(
        self, follow: threading.Event | None, abort: threading.Event | None, idle_s: float
    ) -> None:

        while self.calls or (follow is not None and not follow.is_set()):
            check_interrupt()
            if abort is not None and abort.is_set():
                return
            if follow is not None:
                self.feeding = not follow.is_set()
                for pool in self.pools:
                    self._feed(pool)  # shards that appeared since
                if not self.calls:
                    follow.wait(idle_s)
                    continue
            for ref in ray_ready(list(self.calls), min(1.0, self.timeout)):
                if ref in self.calls:
                    self._handle(ref)
            self._expire()

    def _feed(self, pool: Pool) -> None:
        work = pool.work
        assert work is not None
        while self.feeding and pool.error is None and pool.actors:
            actor = min(pool.actors, key=lambda a: len(a.calls))
            if len(actor.calls) >= PIPELINE:
                return
            item = work.next_chunk()
            if item is None:
                return
            chunk, attempts = item
            ref = actor.handle.score_chunk.remote(chunk, self.flush_rows)
            if not actor.calls:
                actor.running_since = time.monotonic()
            actor.calls.append(ref)
            self.calls[ref] = (pool, actor, chunk, attempts)

    def _handle(self, ref: Any) -> None:
        import ray
        from ray import exceptions as rex

        pool, actor, chunk, attempts = self.calls.pop(ref)
        assert pool.work is not None
        actor.calls.remove(ref)
        actor.running_since = time.monotonic()
        try:
            out = ray.get(ref)
        except rex.RayTaskError as exc:
            if isinstance(getattr(exc, "cause", None), ScorerError):
                self._stop_pool(pool, ray_error(exc))
                return
            self._chunk_failed(pool, chunk, attempts, ray_error(exc))
        except rex.RayError as exc:  # the actor died (node lost, OOM, killed)
            # replaced first: giving the chunk up may stop the pool, which kills its actors
            self._replace(pool, actor, f"died: {actor_error(exc, 200)}")
            self._chunk_failed(pool, chunk, attempts, actor_error(exc))
        else:
            rows = list(out["rows"])
            try:
                check_rows(pool.name, chunk, rows)
            except ScoringError as exc:
                self._chunk_failed(pool, chunk, attempts, str(exc))
            else:
                actor.unflushed.append((chunk, attempts, rows))
                if out["flushed"]:
                    self._flushed(pool, actor)
        self._feed(pool)

    def _flushed(self, pool: Pool, actor: PoolActor) -> None:
        """The actor's held rows are written: its chunks count as scored."""
        assert pool.work is not None
        for chunk, _, rows in actor.unflushed:
            pool.work.write(self.store, chunk, rows, written=True)
            actor.chunks += 1
            actor.rows += len(chunk)
        actor.unflushed = []

    def _flush_all(self) -> bool:
        """Every actor writes the rows it holds; True when an actor failed to and its chunks
        were put back to be scored again."""
        import ray
        from ray import exceptions as rex

        pending = {
            a.handle.flush.remote(): (pool, a)
            for pool in self.pools
            if pool.error is None
            for a in pool.actors
            if a.unflushed
        }
        if not pending:
            return False
        ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=self.timeout)
        requeued = False
        for ref in ready:
            pool, actor = pending[ref]
            try:
                ray.get(ref)
            except rex.RayError as exc:  # died, or the write failed: score its chunks again
                self._replace(pool, actor, f"flush failed: {ray_error(exc)[:200]}")
                requeued = True
            else:
                self._flushed(pool, actor)
        for ref in late:
            pool, actor = pending[ref]
            self._replace(pool, actor, f"flush took over {self.timeout:g}s")
            requeued = True
        return requeued

    def _chunk_failed(self, pool: Pool, chunk: list[Row], attempts: int, error: str) -> None:
        assert pool.work is not None
        try:
            pool.work.chunk_failed(chunk, attempts, error)
        except ScoringError as exc:
            self._stop_pool(pool, str(exc))

    def _expire(self) -> None:
        now = time.monotonic()
        for pool in self.pools:
            for actor in list(pool.actors):
                if actor.calls and now - actor.running_since > self.timeout:
                    ref = actor.calls[0]
                    _, _, chunk, attempts = self.calls.pop(ref)
                    actor.calls.pop(0)
                    error = f"no answer after {self.timeout:g}s (runtime.score_call_timeout_s)"
                    log.warning("scorer %s: %s; its actor is replaced", pool.name, error)
                    self._replace(pool, actor, "call timed out")  # first, as in `_handle`
                    self._chunk_failed(pool, chunk, attempts, error)
                    self._feed(pool)

    def _replace(self, pool: Pool, actor: PoolActor, why: str) -> None:
        """Kill the actor, requeue its queued chunks (uncharged), start another in its slot."""
        import ray

        assert pool.work is not None
        for ref in actor.calls:
            _, _, chunk, attempts = self.calls.pop(ref)
            pool.work.retry.append((chunk, attempts))
        for chunk, attempts, _ in actor.unflushed:  # scored, never written: score again
            pool.work.retry.append((chunk, attempts))
        actor.calls, actor.unflushed = [], []
        actor.end = why
        ray.kill(actor.handle, no_restart=True)
        pool.actors.remove(actor)
        if actor.replaced >= MAX_REPLACEMENTS or pool.error or not regroup(pool, actor.slot):
            if not pool.actors:
                self._stop_pool(pool, f"no actor left (last: {why})")
            return
        new = new_actor(pool, actor.slot, self.run_uri)
        new.replaced = actor.replaced + 1
        new.handle.begin.remote(pool.work.total)
        pool.actors.append(new)
        pool.ended.append(new)

    def _stop_pool(self, pool: Pool, error: str) -> None:
        """The scorer cannot go on: drop its calls and kill its actors (a hung one too)."""
        import ray

        pool.error = pool.error or error
        for ref in [r for r, (p, _, _, _) in self.calls.items() if p is pool]:
            del self.calls[ref]
        for actor in pool.actors:
            actor.calls, actor.end = [], "stopped: scorer failed"
            ray.kill(actor.handle, no_restart=True)
        pool.actors = []

"""How scoring follows generation: `following(...)` wraps the generation stage while a thread (the
`Follower`) scores the ok rows of generation shards as they appear, with the scorers
`runtime.score_during_generation` picks. Its scorers stay up for the final pass
(`Followed`, `stage.score_run(..., followed=)`), so Perspective keeps one rate limiter and one
cache throughout. docs/design.md, Scoring during generation.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.stages.scoring.loop import ScoreLoop
from harness.stages.scoring.pool import (
    Pool,
    PoolSettings,
    Share,
    budget_gpus,
    close_pool,
    local_cores,
    pool_plans,
    pool_settings,
    pool_wants_gpu,
    start_pools,
)
from harness.stages.scoring.work import Work, new_work
from results.run.store import RunStore
from workers.plugins import BUILDING
from workers.scorers.base import ScorerContext, ScorerError
from workers.scorers.cache_mirror import scorer_context
from workers.scorers.registry import load_scorer
from workers.scorers.score_buffer import ScoringError

log = logging.getLogger("harness")
FOLLOW_POLL_S = 5.0  # how often the generation folder is listed
ABORT_JOIN_S = 30.0  # after an exception, how long to wait for the follower to stop


def follow_scorers(
    scorers: Sequence[tuple[str, dict[str, Any]]],
    mode: bool | str,
    device: str | None,
    shares: Mapping[str, Share],
) -> list[tuple[str, dict[str, Any]]]:
    """The scorers that score during generation under `runtime.score_during_generation`."""
    if mode is False:
        return []
    if mode is True:
        return list(scorers)
    return [(n, p) for n, p in scorers if not pool_wants_gpu(n, device, shares.get(n, Share()))]


def followers(cfg: Any) -> list[tuple[str, dict[str, Any]]]:
    """The scorers of `cfg` that score during generation (`follow_scorers` on its entries)."""
    shares = {s.name: Share(s.replicas, s.num_gpus) for s in cfg.scorers}
    scorers = [(s.name, dict(s.params)) for s in cfg.scorers]
    return follow_scorers(scorers, cfg.runtime.score_during_generation, cfg.runtime.device, shares)


def follow_config(cfg: Any, growing: bool, pending: int = 1) -> Any:
    """The config the follower runs with. While generation grows onto GPU nodes that join
    (`runtime.gpus` unset), scorers on GPUs wait for the final pass, or a waiting scorer's
    actor could take a joining node's GPU before generation's new reservation does. With no
    job `pending` nothing follows: the final pass scores what is missing."""
    mode = cfg.runtime.score_during_generation
    on_gpu = [
        s.name
        for s in (cfg.scorers if pending and growing and mode is True else [])
        if pool_wants_gpu(s.name, cfg.runtime.device, Share(s.replicas, s.num_gpus))
    ]
    if on_gpu:
        log.warning(
            "score_during_generation: scorer(s) %s hold GPUs: they score after generation, "
            "which keeps the GPU nodes that join for its replicas (runtime.gpus: auto); set "
            "runtime.gpus to score during generation",
            ", ".join(on_gpu),
        )
    chosen = ("auto" if on_gpu else mode) if pending else False
    if chosen == mode:
        return cfg
    runtime = cfg.runtime.model_copy(update={"score_during_generation": chosen})
    return cfg.model_copy(update={"runtime": runtime})


@dataclass
class Followed:
    """What the follower leaves to the final pass: its scorers, still up, and what they did.

    `live`: name → (parameters, a `pool.Pool` on Ray, or (scorer, cache mirror) in this
    process). `stats`: name → what it scored during generation.
    """

    use_ray: bool
    live: dict[str, tuple[dict[str, Any], Any]] = field(default_factory=dict)
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)

    def take(self, scorers: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """Hand over the live scorers the final pass runs with the same parameters."""
        taken = {}
        for name, params in scorers:
            entry = self.live.get(name)
            if entry is not None and entry[0] == params:
                taken[name] = self.live.pop(name)[1]
        return taken

    def close(self, now: bool = False) -> None:
        """Close the scorers nobody took over (stats of what they did stay in `stats`);
        `now`: kill Ray actors without waiting for their `close` (an interrupted run)."""
        for name in list(self.live):
            _, held = self.live.pop(name)
            try:
                if self.use_ray:
                    close_pool(held, now=now)
                else:
                    scorer, mirror = held
                    scorer.close()
                    if mirror is not None:
                        mirror.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the run's outcome
                log.warning("scorer %s: closing after following generation: %s", name, exc)

    def add_to(self, stats: dict[str, dict[str, Any]]) -> None:
        """Count what was scored during generation in the stage's stats (rows scored then
        were skipped by the final pass as already scored)."""
        for name, during in self.stats.items():
            final = stats.get(name)
            if final is None:  # the final pass did not run it (it could not start)
                keep = ("version", "scored", "status", "failed_chunks")
                stats[name] = {k: during[k] for k in keep} | {"during_generation": during}
                continue
            # rows `missing` then (not in a cache-only Perspective's cache) or `retry` (a
            # transient failure) got no score row: the final pass handed them out again
            unwritten = ("missing", "retry")
            written = during["scored"] - sum(during["status"].get(k, 0) for k in unwritten)
            final["during_generation"] = during
            final["scored"] = final.get("scored", 0) + written
            if final.get("version") == during["version"]:
                final["skipped"] = max(0, final.get("skipped", 0) - written)
            status = dict(final.get("status") or {})
            for key, count in during["status"].items():
                if key not in unwritten:
                    status[key] = status.get(key, 0) + count
            final["status"] = status


class Follower:
    """The thread that scores generation shards as they appear (see the module docstring)."""

    def __init__(
        self,
        store_uri: str,
        scorers: Sequence[tuple[str, dict[str, Any]]],
        context: ScorerContext,
        *,
        use_ray: bool,
        batch_size: int = 64,
        poll_s: float = FOLLOW_POLL_S,
        settings: PoolSettings | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        self.store = RunStore(store_uri)  # its own: a RunStore's scan cache is not thread-safe
        self.scorers, self.context, self.use_ray = list(scorers), context, use_ray
        self.batch_size, self.poll_s = batch_size, poll_s
        self.settings = settings or PoolSettings()
        self.start_timeout_s = start_timeout_s
        self.result = Followed(use_ray)
        self.error: BaseException | None = None
        self._stop = threading.Event()  # generation is over: finish the chunks in flight
        self._abort = threading.Event()  # the generation stage raised: stop now
        self._thread = threading.Thread(target=self._main, name="score-follow", daemon=True)
        self._works: dict[str, Work] = {}
        self._dropped: dict[str, str] = {}  # scorer → why it stopped following

    def start(self) -> None:
        if self.scorers:
            log.info("scoring during generation: %s", ", ".join(name for name, _ in self.scorers))
            self._thread.start()

    def finish(self) -> Followed:
        """Stop after the chunks in flight; join; raise what went wrong in the thread."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        if self.error is not None:
            self.result.close()
            raise self.error
        return self.result

    def abort(self, now: bool = True) -> None:
        """Stop now and close the scorers (the generation stage raised); `now`: kill Ray actors
        without waiting for their `close` (an interrupt)."""
        self._abort.set()
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(ABORT_JOIN_S)
        if self._thread.is_alive():
            log.warning("the scoring follower did not stop within %.0fs", ABORT_JOIN_S)
        if self.error is not None:
            log.error("scoring during generation failed: %s", self.error)
        self.result.close(now=now)

    # ---- the thread ------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            if self.use_ray:
                self._follow_on_ray()
            else:
                self._follow_here()
        except BaseException as exc:  # noqa: BLE001 - raised in the driver by `finish`
            self.error = exc
        for name, work in self._works.items():
            polls = getattr(work.feed, "polls", 0)
            self.result.stats[name] = work.stats(polls=polls, stopped=self._dropped.get(name))
            if work.feed.rows:
                log.info("scorer %s: %d rows scored during generation", name, work.feed.rows)

    def _work(self, name: str, version: str) -> Work:
        retries = self.settings.chunk_retries
        work = new_work(self.store, name, version, self.batch_size, False, retries, self.poll_s)
        self._works[name] = work
        return work

    def _drop(self, name: str, why: str) -> None:
        """A scorer stops following (the final pass starts it again)."""
        log.warning(
            "scorer %s stops scoring during generation (%s); the final pass does it", name, why
        )
        self._dropped[name] = why
        entry = self.result.live.pop(name, None)
        if entry is not None:
            Followed(self.use_ray, {name: entry}).close()

    def _follow_here(self) -> None:
        """In this process (`--no-ray`): the scorers one after the other, a chunk at a time."""
        for name, params in self.scorers:
            if self._stop.is_set():
                return
            try:
                ctx, mirror = scorer_context(name, params, self.context, self.store.uri)
                with BUILDING:  # the generator may be loading in the driver's thread
                    scorer = load_scorer(name)(params, ctx)
            except Exception as exc:  # noqa: BLE001 - the final pass reports it
                log.warning("scorer %s cannot score during generation: %s", name, exc)
                continue
            self.result.live[name] = (params, (scorer, mirror))
            self._work(name, scorer.version)
            scorer.begin(0)
        while not self._stop.is_set():
            idle = True
            for name in [n for n in self._works if n in self.result.live]:
                if self._stop.is_set():
                    break
                item = self._works[name].next_chunk()
                if item is not None:
                    idle = False
                    self._score_here(name, *item)
            if idle:
                self._stop.wait(self.poll_s)

    def _score_here(self, name: str, chunk: list[dict[str, Any]], attempts: int) -> None:
        try:
            scorer, mirror = self.result.live[name][1]
            self._works[name].score_here(self.store, scorer, mirror, chunk, attempts)
        except ScorerError as exc:
            self._drop(name, f"{type(exc).__name__}: {exc}")
        except ScoringError as given_up:
            self._drop(name, str(given_up))

    def _follow_on_ray(self) -> None:
        """A pool of actors per scorer (`pool`), fed as shards appear (`loop.ScoreLoop`)."""
        from harness.stages.generation.ray_runtime import cluster_gpus

        gpus = budget_gpus(self.settings, cluster_gpus())
        plans = pool_plans(self.scorers, self.context, local_cores(self.settings), gpus)
        pools = []
        for name, params in self.scorers:
            if plans[name].num_gpus == 0 and pool_wants_gpu(
                name, self.context.device, self.settings.shares.get(name, Share())
            ):
                log.info("scorer %s waits for the final pass: no GPU in the cluster yet", name)
                continue  # never a silent CPU fallback
            pool = Pool(name, params, plans[name], self.context)
            self.result.live[name] = (params, pool)  # `abort` closes what started
            pools.append(pool)
        start_pools(pools, self.store.uri, self.start_timeout_s, stop=self._stop)
        for pool in pools:
            if pool.error is not None:
                self._drop(pool.name, pool.error)
        loop = ScoreLoop(self.store, pools, self.settings, lambda p: self._work(p.name, p.version))
        if not loop.pools:
            return
        loop.run(follow=self._stop, abort=self._abort, idle_s=min(1.0, self.poll_s))
        for pool in loop.pools:
            pool.work = None  # the final pass gives each pool its own
            if pool.error is not None:
                self._drop(pool.name, pool.error)


@contextlib.contextmanager
def following(
    store: RunStore,
    cfg: Any,
    words: Any,
    *,
    use_ray: bool,
    poll_s: float | None = None,
) -> Iterator[Follower]:
    """Score with the scorers that follow (`runtime.score_during_generation`, `follow_config`)
    while the block runs; the `Follower`'s `result` is then the final pass's `followed=`."""
    rt = cfg.runtime
    settings = pool_settings(cfg)
    scorers = [(s.name, dict(s.params)) for s in cfg.scorers]
    chosen = follow_scorers(scorers, rt.score_during_generation, rt.device, settings.shares)
    context = ScorerContext(words=words, cache_dir=rt.cache_dir, device=rt.device)
    follower = Follower(
        store.uri,
        chosen,
        context,
        use_ray=use_ray,
        batch_size=rt.score_batch_size,
        poll_s=FOLLOW_POLL_S if poll_s is None else poll_s,
        settings=settings,
        start_timeout_s=rt.actor_start_timeout_s,
    )
    follower.start()
    try:
        yield follower
    except BaseException as exc:
        follower.abort(now=not isinstance(exc, Exception))  # SIGINT / SIGTERM: no waiting
        raise
    follower.finish()

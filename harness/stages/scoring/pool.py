"""Where scoring runs: each scorer's pool of actors, sized (`pool_plans`: a GPU scorer one actor
per GPU of the budget at 1/k GPU for k GPU scorers, a CPU scorer one, Perspective exactly one:
one rate limiter, one cache writer), started and closed, and `PoolSettings` (from `runtime` and
`scorers`). On a cluster a GPU pool reserves a placement group per actor (this run's own demand,
never `request_resources`' one request per cluster), waited for up to `runtime.gpu_wait_s` and
re-planned for the GPUs left after a node loss. docs/design.md, Scoring; docs/cluster.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from harness.stages.generation.backends import Placement, cpu_threads, ray_error
from harness.stages.generation.cpu_sizing import machine_here, scorer_threads
from harness.stages.generation.reservation import (
    in_group,
    live_group,
    new_group,
    placed,
    remove_groups,
    settle,
)
from harness.stages.scoring.work import Work
from jobs.catalog import SCORER_PARAMS
from workers.scorers.base import ScorerContext
from workers.scorers.cache_mirror import SYNCED_CACHES
from workers.scorers.registry import load_scorer
from workers.scorers.score_buffer import FLUSH_ROWS, Row

log = logging.getLogger("harness")
REPLACE_PLACE_S = 2.0  # a replacement's group not placed by then: its pool goes on without it


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
    cores: int = 0  # a local Ray's machine: its cores go to CPU pools' threads (0: one each)


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


def pool_wants_gpu(name: str, device: str | None, share: Share) -> bool:
    """Whether a scorer's pool takes a GPU wherever it runs (its config entry, else its class)."""
    if share.num_gpus is not None:
        return share.num_gpus > 0
    return bool(load_scorer(name).wants_gpu) and device != "cpu"


@dataclass
class PoolActor:
    handle: Any
    slot: int
    info: dict[str, Any] = field(default_factory=dict)
    calls: list[Any] = field(default_factory=list)  # refs, oldest (running) first
    running_since: float = 0.0
    chunks: int = 0
    rows: int = 0
    end: str = "running"
    replaced: int = 0
    unflushed: list[tuple[list[Row], int, list[Row]]] = field(default_factory=list)

    def summary(self, plan: Placement) -> dict[str, Any]:
        keep = ("host", "node_id", "pid", "gpu_ids", "threads")
        out = {k: self.info.get(k) for k in keep}
        out.update(num_gpus=plan.num_gpus, chunks=self.chunks, rows=self.rows, end=self.end)
        return out


@dataclass
class Pool:
    """One scorer's actors and work."""

    name: str
    params: dict[str, Any]
    plan: Placement
    context: ScorerContext
    actors: list[PoolActor] = field(default_factory=list)
    ended: list[PoolActor] = field(default_factory=list)
    work: Work | None = None
    version: str = ""
    error: str | None = None
    closed: list[dict[str, Any]] = field(default_factory=list)
    groups: list[Any] = field(default_factory=list)  # slot → placement group (cluster GPU pools)


def pool_plans(
    scorers: Sequence[tuple[str, dict[str, Any]]],
    context: ScorerContext,
    settings: PoolSettings,
    gpus: float,
) -> dict[str, Placement]:
    """Actors per scorer for a cluster with (or a budget of) `gpus` GPUs."""
    classes = {name: load_scorer(name) for name, _ in scorers}
    shares = {name: settings.shares.get(name, Share()) for name, _ in scorers}

    def on_gpu(name: str) -> bool:
        share = shares[name]
        return pool_wants_gpu(name, context.device, share) and (
            share.num_gpus is not None or gpus > 0
        )

    k = sum(1 for name in classes if on_gpu(name) and shares[name].num_gpus is None)
    with_model = [n for n, p in scorers if not on_gpu(n) and has_model(n, p)]
    threads = scorer_threads(settings.cores, len(with_model)) if settings.cores else 0
    plans = {}
    for name, cls in classes.items():
        share, cpus = shares[name], float(cls.num_cpus)
        if name in SYNCED_CACHES:  # one rate limiter, one writer of the cache
            plans[name] = Placement(1, share.num_gpus or 0.0, cpus)
        elif on_gpu(name):
            per = share.num_gpus if share.num_gpus is not None else 1.0 / max(1, k)
            count = share.replicas or max(1, int(gpus) if gpus >= 1 else 1)
            plans[name] = Placement(count, per, cpus)
        else:  # a model's forward pass over a batch is large enough for threads
            each = threads if name in with_model else 0
            plans[name] = Placement(share.replicas or 1, 0.0, cpus, threads=each)
    return plans


def has_model(name: str, params: Mapping[str, Any]) -> bool:
    """Whether the scorer runs a model (a `model` parameter: perplexity, the classifiers)."""
    return isinstance({**SCORER_PARAMS.get(name, {}), **params}.get("model"), str)


def local_cores(settings: PoolSettings) -> PoolSettings:
    """`settings` with this machine's cores when the pools run on a local Ray (CPU pools'
    threads: `pool_plans`); on a cluster unchanged (nodes' cores are not known here)."""
    from harness.stages.generation.ray_runtime import cluster_mode

    return settings if cluster_mode() else replace(settings, cores=machine_here().cores)


def plan_with_gpus(
    scorers: Sequence[tuple[str, dict[str, Any]]], context: ScorerContext, settings: PoolSettings
) -> dict[str, Placement]:
    """Pool plans for the budget: `runtime.gpus`, else the GPUs the cluster has (a local Ray:
    at most those). In cluster mode the GPU pools then reserve and wait for their GPUs
    (`reserve_pools`)."""
    from harness.stages.generation.ray_runtime import cluster_gpus, cluster_mode

    have = cluster_gpus()
    if not cluster_mode():
        return pool_plans(scorers, context, local_cores(settings), budget_gpus(settings, have))
    gpus = float(settings.gpus) if settings.gpus else max(have, 1.0)
    return pool_plans(scorers, context, settings, gpus)


def budget_gpus(settings: PoolSettings, have: float) -> float:
    """The GPUs pools are sized for without waiting: the budget, at most what the cluster has."""
    return min(float(settings.gpus), have) if settings.gpus and have else have


def new_actor(pool: Pool, slot: int, run_uri: str) -> PoolActor:
    """The actor of `slot`, inside the slot's placement group when the pool has one."""
    from workers.actors import ScorerActor

    p = pool.plan
    group = pool.groups[slot] if slot < len(pool.groups) else None
    handle = ScorerActor.options(  # type: ignore[attr-defined]
        num_cpus=p.num_cpus,
        num_gpus=p.num_gpus,
        max_restarts=0,
        max_task_retries=0,
        **in_group(group),
    ).remote(pool.name, pool.params, pool.context, cpu_threads(p.num_cpus, p.threads), run_uri)
    return PoolActor(handle, slot)


def start_pools(
    pools: list[Pool], run_uri: str, timeout_s: float, stop: threading.Event | None = None
) -> None:
    """Start every actor of every pool; keep those ready within `timeout_s` (or when `stop`
    is set: the follower was told to stop)."""
    import ray

    pending: dict[Any, tuple[Pool, PoolActor]] = {}
    for pool in pools:
        for slot in range(pool.plan.replicas):
            actor = new_actor(pool, slot, run_uri)
            pending[actor.handle.info.remote()] = (pool, actor)
    ready: list[Any] = []
    not_ready = list(pending)
    started = time.monotonic()
    deadline = started + timeout_s
    while not_ready and (stop is None or not stop.is_set()):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        done, not_ready = ray.wait(not_ready, num_returns=len(not_ready), timeout=min(1.0, left))
        ready += done
    waited = time.monotonic() - started
    errors: dict[str, str] = {}
    for ref in ready:
        pool, actor = pending[ref]
        try:
            actor.info = dict(ray.get(ref))
            pool.actors.append(actor)
            pool.version = str(actor.info["version"])
        except Exception as exc:  # noqa: BLE001 - __init__ raised (bad label map, no key...)
            errors[pool.name] = f"cannot start: {ray_error(exc)}"
            ray.kill(actor.handle)
    for ref in not_ready:
        pool, actor = pending[ref]
        ray.kill(actor.handle)
        log.warning("scorer %s: actor %d not ready after %.0fs", pool.name, actor.slot, waited)
    for pool in pools:
        if pool.name in errors:
            pool.error = errors[pool.name]
        elif not pool.actors:
            pool.error = (
                f"no actor ready after {waited:.0f}s: the cluster may lack the resources "
                f"it asks for ({pool.plan.num_gpus:g} GPU, {pool.plan.num_cpus:g} CPU each), "
                "or the model download is slow"
            )
        if pool.error:
            for actor in pool.actors:
                ray.kill(actor.handle)
            pool.actors = []
        else:
            pool.ended = list(pool.actors)


def close_pool(pool: Pool, now: bool = False) -> None:
    """Close the pool's actors (their stats go to `pool.closed`) and kill them; `now`: kill
    them without waiting for their `close` (an interrupted run)."""
    import ray

    for actor in pool.actors:
        try:
            if not now:
                pool.closed.append(dict(ray.get(actor.handle.close.remote(), timeout=120)))
                actor.end = "released" if actor.end == "running" else actor.end
        except Exception as exc:  # noqa: BLE001 - a dead actor has no stats; say so
            pool.closed.append({"close_error": ray_error(exc)})
        finally:
            ray.kill(actor.handle)
    pool.actors = []


# ---- GPU reservations on a cluster --------------------------------------------------------


def reserve_pools(
    pools: list[Pool], replan: Callable[[float], Mapping[str, Placement]], wait_s: float
) -> None:
    """A placement group per actor of each GPU pool, waited for (module doc); a pool keeps the
    placed ones (its replicas shrink to them), a pool with none gets its `error`."""
    from harness.stages.generation.ray_runtime import cluster_gpus, lost_gpus

    gpu_pools = [p for p in pools if p.plan.num_gpus > 0 and p.error is None]
    if not gpu_pools:
        return
    for pool in gpu_pools:
        p = pool.plan
        pool.groups = [
            new_group(p.num_gpus, p.num_cpus, f"lidao-score:{pool.name}#{i}")
            for i in range(p.replicas)
        ]

    def fits() -> Mapping[str, int] | None:
        if lost_gpus() <= 0:
            return None
        return {name: plan.replicas for name, plan in replan(cluster_gpus()).items()}

    what = "GPU scorer pool(s) " + ", ".join(p.name for p in gpu_pools)
    done = settle({p.name: p.groups for p in gpu_pools}, wait_s, what, fits=fits)
    for pool in gpu_pools:
        keep = done[pool.name]
        remove_groups([g for g in pool.groups if g not in keep])
        if not keep:
            pool.error = (
                f"cannot start: needs {pool.plan.num_gpus:g} GPU(s) per actor but none could "
                f"be placed after waiting {wait_s:g}s (runtime.gpu_wait_s); the cluster has "
                f"{cluster_gpus():g}. Check `ray status` (GPU node types, their max_workers, "
                "your cloud's GPU quota), or set `runtime: {device: cpu}` to run on CPUs."
            )
        pool.groups = keep
        pool.plan = replace(pool.plan, replicas=max(1, len(keep)))


def regroup(pool: Pool, slot: int) -> bool:
    """Before replacing the actor of `slot`: its group on a live node. False (the slot is
    given up, its group removed) when that group is not placed within `REPLACE_PLACE_S` while
    the pool still has actors: the pool goes on with the GPUs left."""
    if slot >= len(pool.groups) or pool.groups[slot] is None:
        return True  # no reservation (local Ray, CPU pool)
    group = pool.groups[slot] = live_group(pool.groups[slot])
    if not pool.actors or placed([group], timeout=REPLACE_PLACE_S):
        return True
    remove_groups([group])
    pool.groups[slot] = None
    log.warning(
        "scorer %s: no room for actor %d's %g GPU after its loss; going on with %d actor(s)",
        pool.name,
        slot,
        pool.plan.num_gpus,
        len(pool.actors),
    )
    return False


def free_pools(pools: Sequence[Pool]) -> None:
    """The stage is over: remove the pools' groups (this run's demand, nobody else's)."""
    groups = [g for pool in pools for g in pool.groups if g is not None]
    for pool in pools:
        pool.groups = []
    if groups:
        remove_groups(groups)

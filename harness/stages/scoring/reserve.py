"""GPU scorer pools on a cluster: a placement group per actor (this run's own demand, never
`request_resources`' one request per cluster), waited for up to `runtime.gpu_wait_s`, the pools
re-planned for the GPUs left after a node loss (docs/cluster.md, scoring's reservations).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from harness.stages.generation.backends import Placement
from harness.stages.generation.reservation import (
    live_group,
    new_group,
    placed,
    remove_groups,
    settle,
)
from harness.stages.scoring.pool import Pool

log = logging.getLogger("harness")
REPLACE_PLACE_S = 2.0  # a replacement's group not placed by then: its pool goes on without it


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
        pool.plan = dataclasses.replace(pool.plan, replicas=max(1, len(keep)))


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

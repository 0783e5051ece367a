"""GPUs reserved for generation: the run's budget (`request_budget`, split between the models by
`split_budget`) and one Ray placement group of one bundle per GPU replica, created before any
actor or scorer starts so a placed bundle is that replica's alone; one group per replica (not
one for the set) so replicas start one by one as nodes join. Rules: docs/cluster.md, Placement.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from harness.config import ModelConfig, RunConfig
from jobs.spec import ModelRef

log = logging.getLogger("harness")
GROW_POLL_S = 2.0  # how often growth looks at the cluster's GPUs (runtime.gpus unset)


def gpu_share(mc: ModelConfig, device: str | None) -> float:
    """GPUs per replica: the model's `num_gpus`, else 1 (0 with `runtime.device: cpu`)."""
    if mc.num_gpus is not None:
        return mc.num_gpus
    return 0.0 if device == "cpu" else 1.0


def split_budget(models: Sequence[ModelConfig], shares: Sequence[float], gpus: float) -> list[int]:
    """Replicas of each GPU model (share > 0) under a budget of `gpus` (see the module doc).

    Models with `replicas` keep them; the others share what is left evenly, at least one each.
    """
    fixed = sum(m.replicas * s for m, s in zip(models, shares, strict=True) if m.replicas)
    free = [i for i, m in enumerate(models) if not m.replicas]
    part = max(0.0, gpus - fixed) / len(free) if free else 0.0
    out = []
    for i, (m, s) in enumerate(zip(models, shares, strict=True)):
        if m.replicas:
            out.append(m.replicas)
        else:
            assert i in free
            out.append(max(1, math.floor(part / s + 1e-9)))
    return out


@dataclasses.dataclass(frozen=True)
class Budget:
    """What generation asks for at once: replicas and GPUs per replica of each GPU model."""

    replicas: dict[str, int]  # model id → replicas at the start
    shares: dict[str, float]  # model id → GPUs per replica
    limit: int | None  # runtime.gpus (None: auto)
    gpus_per_node: float | None = None  # the GPU node type's GPUs, when known
    counts: tuple[int, ...] = ()  # replicas of each GPU model entry, in order (ids may repeat)

    @property
    def gpus(self) -> float:
        return sum(self.replicas[m] * self.shares[m] for m in self.replicas)

    @property
    def nodes(self) -> int | None:
        """GPU nodes that hold the budget (bundles packed whole on nodes); None: unknown."""
        if not self.gpus_per_node:
            return None
        per = self.gpus_per_node
        # first fit, largest share first: a bundle is never split over nodes
        bins: list[float] = []
        for m in sorted(self.replicas, key=lambda m: -self.shares[m]):
            for _ in range(self.replicas[m]):
                s = self.shares[m]
                for i, room in enumerate(bins):
                    if room + 1e-9 >= s:
                        bins[i] -= s
                        break
                else:
                    bins.append(per - s)
        return len(bins)

    def line(self) -> str:
        """One line for the log and `validate`."""
        if not self.replicas:
            return "GPU budget: none (every model runs on CPU replicas)"
        each = ", ".join(f"{m}: {n} × {self.shares[m]:g} GPU" for m, n in self.replicas.items())
        nodes = f" on {self.nodes} GPU node(s)" if self.nodes is not None else ""
        if self.limit is None:
            return (
                f"GPU budget: auto, {self.gpus:g} GPU(s){nodes} to start ({each}); one more "
                "replica per GPU that joins"
            )
        over = (
            f"; above runtime.gpus: {self.limit} (every model gets at least one replica)"
            if self.gpus > self.limit + 1e-9
            else ""
        )
        return f"GPU budget: {self.gpus:g} GPU(s){nodes} (runtime.gpus: {self.limit}; {each}){over}"


def request_budget(
    cfg: RunConfig, cluster_gpus: float | None = None, gpus_per_node: float | None = None
) -> Budget:
    """The GPUs generation asks for at once (`Budget.gpus`, `Budget.nodes`, `Budget.line()`).

    `cluster_gpus`: the GPUs the cluster has (None: unknown, e.g. `validate`; then the budget
    of `runtime.gpus: auto` is one replica per model). Models on CPU (`runtime.device: cpu`
    without `num_gpus`, or `num_gpus: 0`) hold no GPU and are not in it.
    """
    return budget_for(cfg.models, cfg.runtime.device, cfg.runtime.gpus, cluster_gpus, gpus_per_node)


def budget_for(
    models: Sequence[ModelConfig],
    device: str | None,
    limit: int | None,
    cluster_gpus: float | None,
    gpus_per_node: float | None = None,
    cap: float | None = None,
) -> Budget:
    """`request_budget` for these model entries; `cap`: at most this many GPUs (a local Ray)."""
    gpu_models = [m for m in models if gpu_share(m, device) > 0]
    shares = [gpu_share(m, device) for m in gpu_models]
    gpus = float(limit) if limit is not None else (cluster_gpus or 0.0)
    if cap is not None:
        gpus = min(gpus, cap)
    counts = split_budget(gpu_models, shares, gpus)
    return Budget(
        {m.ref().id: n for m, n in zip(gpu_models, counts, strict=True)},
        {m.ref().id: s for m, s in zip(gpu_models, shares, strict=True)},
        limit,
        gpus_per_node,
        tuple(counts),
    )


# ---- Ray ---------------------------------------------------------------------------------


def new_group(share: float, cpus: float, name: str) -> Any:
    """A placement group of one bundle for one replica (pending until a node can hold it)."""
    from ray.util.placement_group import placement_group

    bundle = {"GPU": share}
    if cpus:
        bundle["CPU"] = cpus
    return placement_group([bundle], strategy="STRICT_PACK", name=name)


def in_group(group: Any) -> dict[str, Any]:
    """Actor options that create it inside `group`'s bundle (none for no group)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, 0)}


def live_group(group: Any) -> Any:
    """`group` when its bundle sits on a live node (or waits to be placed); else a new group of
    the same bundle, kept off the old one's node, the old group removed. For replacements after
    an actor's death: the driver sees the death seconds before Ray marks a lost node dead (it
    misses the node's heartbeats first), so a node Ray still calls alive counts as lost when its
    raylet refuses or does not answer a connection (`raylet_answers`). The new group is placed
    only on another live node; a replacement in the old one would die there once more."""
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import placement_group

    table = placement_group_table(group)
    state = table.get("state")
    if state in ("PENDING", "PREPARED"):
        return group
    alive = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    on = set(table.get("bundles_to_node_id", {}).values())
    lost = {n for n in on if n and (n not in alive or not raylet_answers(alive[n]))}
    if state == "CREATED" and not lost:
        return group
    bundles = [dict(b) for _, b in sorted(table["bundles"].items())]
    name = (table.get("name") or "") + "'"  # names are unique while the old one lives
    away = [{NODE_LABEL: f"!in({','.join(sorted(lost))})"}] * len(bundles) if lost else None
    fresh = placement_group(bundles, strategy="STRICT_PACK", name=name, bundle_label_selector=away)
    log.info(
        "placement group %s was on a lost node (%s, %s): a new one elsewhere",
        table.get("name"),
        state,
        ", ".join(sorted(lost)) or "unplaced",
    )
    remove_groups([group])
    return fresh


NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
RAYLET_PROBE_S = 2.0  # how long a raylet has to accept a connection


def raylet_answers(node: Mapping[str, Any], timeout: float = RAYLET_PROBE_S) -> bool:
    """Whether the node's raylet accepts a TCP connection (every node and the driver reach each
    other's raylet port; docs/cluster.md). A lost node's port refuses it (its process is gone)
    or never answers (its machine is); an entry without an address counts as answering."""
    import socket

    host, port = node.get("NodeManagerAddress"), node.get("NodeManagerPort")
    if not host or not port:
        return True
    try:
        with socket.create_connection((str(host), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


_ready: dict[Any, Any] = {}  # group id → its one `ready()` ref (each call registers a wait)


def remove_groups(groups: Sequence[Any]) -> None:
    from ray.util.placement_group import remove_placement_group

    for group in groups:
        _ready.pop(group.id, None)
        try:
            remove_placement_group(group)
        except Exception as exc:  # noqa: BLE001 - already gone with its node or driver
            log.debug("placement group %s: %s", group, exc)


def placed(groups: Sequence[Any], timeout: float = 0.0) -> list[Any]:
    """The groups among `groups` whose bundle is placed (waits up to `timeout` for one)."""
    import ray

    if not groups:
        return []
    refs = {}
    for g in groups:
        if g.id not in _ready:
            _ready[g.id] = g.ready()
        refs[_ready[g.id]] = g
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    return [refs[r] for r in ready]


G = TypeVar("G")
K = TypeVar("K")


def settle(
    groups: Mapping[K, Sequence[G]],
    wait_s: float,
    what: str,
    placed_now: Callable[[list[G]], list[G]] = placed,
    fits: Callable[[], Mapping[K, int] | None] = lambda: None,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[K, list[G]]:
    """Each key's placed groups: once all are placed, once every key has as many placed as
    `fits()` says the GPUs left hold (None: no GPU lost, so keep waiting; scoring's pools), or
    at `wait_s`. `what` names them in the log."""
    start = next_log = clock()
    total = sum(len(gs) for gs in groups.values())
    while True:
        done = {k: placed_now(list(gs)) for k, gs in groups.items()}
        count = sum(len(d) for d in done.values())
        if count == total:
            return done
        want = fits()
        if want is not None and all(
            len(done[k]) >= min(max(1, want.get(k, len(gs))), len(gs)) for k, gs in groups.items()
        ):
            log.warning(
                "%s re-planned for the GPUs left after a node loss: %s",
                what,
                ", ".join(f"{k} {len(done[k])} of {len(gs)}" for k, gs in groups.items()),
            )
            return done
        if clock() - start >= wait_s:
            if count:
                log.warning(
                    "%s: %d of %d placed after %gs; going on with those", what, count, total, wait_s
                )
            return done
        if clock() >= next_log:
            log.info("%s: %d of %d placed; waiting up to %gs", what, count, total, wait_s)
            next_log = clock() + 30
        sleep(poll_s)


class Growth:
    """`runtime.gpus` unset on a cluster that grows: more replicas as GPU nodes join.

    Called by the dispatcher's loop; every `GROW_POLL_S` it compares the cluster's GPUs with
    what it saw last, and for a cluster that grew creates placement groups for the replicas
    the new budget gives each growing model (`split_budget`); it hands back those placed
    since, as (model, group) for new actor slots. Only capacity that has joined is asked for:
    an autoscaler is never driven past what the cluster already has.
    """

    def __init__(
        self,
        configs: dict[ModelRef, ModelConfig],
        shares: dict[ModelRef, float],
        groups: dict[ModelRef, list[Any]],
        seen_gpus: float,
        cluster_gpus: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.configs, self.shares = configs, shares
        self.count = {m: len(gs) for m, gs in groups.items()}
        self.seen = seen_gpus
        self.cluster_gpus, self.clock = cluster_gpus, clock
        self.pending: list[tuple[ModelRef, Any]] = []
        self.created: list[Any] = []
        self.last = clock()

    def __call__(self) -> list[tuple[ModelRef, Any]]:
        if self.clock() - self.last < GROW_POLL_S:
            return []
        self.last = self.clock()
        have = float(self.cluster_gpus())
        if have > self.seen + 1e-9:
            self.seen = have
            models = list(self.configs)
            target = split_budget(
                [self.configs[m] for m in models], [self.shares[m] for m in models], have
            )
            for m, want in zip(models, target, strict=True):
                if self.configs[m].replicas:
                    continue
                for _ in range(want - self.count[m]):
                    name = f"lidao:{m.id}#{self.count[m]}"
                    group = new_group(self.shares[m], self.configs[m].num_cpus or 1.0, name)
                    self.pending.append((m, group))
                    self.created.append(group)
                    self.count[m] += 1
                    log.info("%g GPU(s) in the cluster now: one more replica of %s", have, m.id)
        if not self.pending:
            return []
        ready = set(placed([g for _, g in self.pending]))
        out = [(m, g) for m, g in self.pending if g in ready]
        self.pending = [(m, g) for m, g in self.pending if g not in ready]
        return out

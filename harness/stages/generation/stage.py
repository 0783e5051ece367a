"""The generation stage: pending jobs → per-model queues of batches → actors → shards.

`generate_stage` places each model (replicas, resources, device) and hands its queue, fed
lazily from the plan (`Plan.batches`), to a `dispatch.Dispatcher` over Ray actors (or plain
`Generator`s with `--no-ray`). Actors write their shards; the stage writes only the error rows
of batches that failed every retry. Per-actor throughput goes to the manifest."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from harness.config import ModelConfig, RunConfig
from harness.progress import Progress
from harness.stages.generation.backends import Batch, LocalBackend, Placement, RayBackend
from harness.stages.generation.cpu_sizing import AUTO_CPU_BATCH, cpu_choices, cpu_models
from harness.stages.generation.devices import visible_gpus
from harness.stages.generation.dispatch import PIPELINE, Dispatcher, Observer
from harness.stages.generation.dispatch_state import ModelWork, Policy
from harness.stages.generation.planning import Plan
from harness.stages.generation.reservation import (
    Growth,
    budget_for,
    gpu_share,
    new_group,
    remove_groups,
    settle,
)
from jobs.grid import CHUNK_SIZE
from jobs.spec import JobSpec, ModelRef
from jobs.words import GroupWords
from results.run.history import update_manifest
from results.run.store import RunStore
from results.schema import error_row

log = logging.getLogger("harness")


class GenerationError(RuntimeError):
    """A model that cannot run (bad id, no actor could start: its jobs stay pending), or a
    method that could not start (its jobs are error rows). `stats` is the stage's stats."""

    def __init__(self, message: str, stats: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.stats = stats or {}


def placement(mc: ModelConfig, cluster_gpus: float, device: str | None) -> Placement:
    """Replicas and resources of one model alone: by default one replica per GPU.

    `num_gpus` below 1 packs replicas on a GPU; above 1 spreads one over several (`device_map`
    "auto"). Without GPUs: CPU replicas of `num_cpus` each. `replicas` overrides the count."""
    cpus = mc.num_cpus or 1.0
    per_replica = mc.num_gpus if mc.num_gpus is not None else (1.0 if cluster_gpus >= 1 else 0.0)
    if device == "cpu" and mc.num_gpus is None:
        per_replica = 0.0
    if per_replica > 0:
        replicas = mc.replicas or max(1, int(cluster_gpus // per_replica))
        return Placement(
            replicas, per_replica, cpus, device or ("auto" if per_replica > 1 else "cuda")
        )
    return Placement(mc.replicas or 1, 0.0, cpus, device or "cpu")


def local_cpu_placements(
    cfg: RunConfig,
    plan: Plan,
    gpus: float,
    following: Sequence[tuple[str, dict[str, Any]]] = (),
) -> dict[ModelRef, Placement]:
    """The CPU replicas × threads of each model that generates on CPU on this machine's Ray
    (`harness.stages.generation.cpu_sizing`), each choice logged as `validate` prints it."""
    todo = set(plan.models())
    entries = {i: m.ref() for i, m in enumerate(cfg.models) if m.ref() in todo}
    entries = {i: entries[i] for i in cpu_models(cfg, gpus, list(entries))}
    pending = {i: [c.pending for c in plan.counts if c.key.model == r] for i, r in entries.items()}
    out: dict[ModelRef, Placement] = {}
    for i, choice in cpu_choices(cfg, pending, following).items():
        log.info("%s", choice.line(i))
        device = cfg.runtime.device or "cpu"
        out.setdefault(entries[i], Placement(choice.replicas, 0.0, choice.num_cpus, device))
    return out


LOCAL_PLACE_S = 10.0  # a local Ray's GPUs are there at once: how long to wait for its groups


@dataclasses.dataclass
class Setup:
    """What the stage runs on: each model's placement, its replicas' reservations (placement
    groups, `harness.stages.generation.reservation`), and growth as GPU nodes join (`runtime.gpus` unset)."""

    placements: dict[ModelRef, Placement]
    groups: dict[ModelRef, list[Any]] = dataclasses.field(default_factory=dict)
    grow: Growth | None = None

    def release(self) -> None:
        """Remove every reservation (those the dispatcher freed already are skipped by Ray)."""
        groups = [g for gs in self.groups.values() for g in gs]
        groups += self.grow.created if self.grow is not None else []
        if groups:
            remove_groups(groups)
        self.groups, self.grow = {}, None


def reserve_generation(
    cfg: RunConfig, plan: Plan, following: Sequence[tuple[str, dict[str, Any]]] = ()
) -> Setup:
    """The placement of each model with pending jobs in `plan`, and a placement group reserved
    for each GPU replica, all created at once and waited for (docs/cluster.md, Placement); a
    model none of whose replicas could be placed is a `GenerationError` (its jobs stay pending),
    never a CPU fallback. On a local Ray, CPU replicas are sized to the machine with the memory
    of the `following` scorers' models counted (`local_cpu_placements`). Call this before
    anything else takes GPUs."""
    from harness.stages.generation.ray_runtime import cluster_gpus, cluster_mode

    rt = cfg.runtime
    models = plan.models()
    configs = {m: next(mc for mc in cfg.models if mc.ref() == m) for m in models}
    have = cluster_gpus()
    local = not cluster_mode()
    shares = {m: gpu_share(mc, rt.device) for m, mc in configs.items()}
    gpu_models = [m for m in models if shares[m] > 0]
    cpu_only = {m: placement(mc, 0.0, rt.device) for m, mc in configs.items()}
    if local:
        cpu_only.update(local_cpu_placements(cfg, plan, have, following))
    if not gpu_models:
        return Setup(cpu_only)
    if local and have == 0 and rt.device is None and not any(configs[m].num_gpus for m in models):
        log.warning("this local Ray has no GPU: generation runs on CPU (runtime.device)")
        return Setup(cpu_only)
    entries = [configs[m] for m in gpu_models]
    budget = budget_for(entries, rt.device, rt.gpus, have, cap=have if local else None)
    log.info("%s", budget.line())
    placements = dict(cpu_only)
    groups: dict[ModelRef, list[Any]] = {}
    for m, n in zip(gpu_models, budget.counts, strict=True):
        share, cpus = shares[m], configs[m].num_cpus or 1.0
        placements[m] = Placement(n, share, cpus, rt.device or ("auto" if share > 1 else "cuda"))
        groups[m] = [new_group(share, cpus, f"lidao:{m.id}#{i}") for i in range(n)]
    setup = Setup(placements, groups)
    wait_s = min(rt.gpu_wait_s, LOCAL_PLACE_S) if local else rt.gpu_wait_s
    what = "generation of " + ", ".join(m.id for m in gpu_models)
    done = settle(groups, wait_s, f"{what} ({have:g} GPU(s) in the cluster)")
    missing = [m for m in gpu_models if not done[m]]
    if missing:
        setup.release()
        raise GenerationError(
            f"{what}: {', '.join(m.id for m in missing)} needs "
            f"{max(shares[m] for m in missing):g} GPU(s) but the cluster has {cluster_gpus():g} "
            f"after waiting {wait_s:g}s (runtime.gpu_wait_s) and no replica could be placed. "
            "Check `ray status` (GPU node types, their max_workers, your cloud's GPU quota), "
            "or set `runtime: {device: cpu}` to run on CPUs."
        )
    if not local and rt.gpus is None and any(not configs[m].replicas for m in gpu_models):
        setup.grow = Growth(
            {m: configs[m] for m in gpu_models},
            {m: shares[m] for m in gpu_models},
            groups,
            have,
            cluster_gpus,
        )
    return setup


def generate_stage(
    store: RunStore,
    cfg: RunConfig,
    jobs: Sequence[JobSpec] | Plan,
    words: GroupWords,
    use_ray: bool = True,
    progress: bool = True,
    observer: Observer | None = None,
    setup: Setup | None = None,
) -> dict[str, Any]:
    """Generate every planned job that has no row yet; returns the stats for the manifest.

    `jobs`: the plan stage's `Plan`, or a list of jobs (done ids, error rows too, read here).
    `setup`: `reserve_generation`'s reservations (made here when None), released when it ends.
    Raises `GenerationError` (after the other models are done and the manifest is written) when a
    model could not run at all or a method could not start; its `stats` are the stage's stats."""
    if not isinstance(jobs, Plan):
        jobs = Plan.from_jobs(jobs, store.done_ids())
    plan = jobs
    stats: dict[str, Any] = {
        "planned": plan.planned,
        "pending_at_start": plan.pending,
        "actors": [],
        "models": {},
    }
    if not plan.pending:
        if setup is not None:
            setup.release()
        return stats
    models = plan.models()
    bar = Progress(
        "generate", total=plan.planned, done=plan.planned - plan.pending, enabled=progress
    )
    rt = cfg.runtime
    policy = Policy(
        rt.max_batch_retries, rt.max_actor_restarts, rt.actor_start_timeout_s, rt.progress_log_s
    )
    start = time.perf_counter()
    dispatchers: list[Dispatcher] = []
    try:
        if use_ray:
            _warn_local_run_dir(store)
            try:
                setup = setup or reserve_generation(cfg, plan)
            except GenerationError as exc:
                stats["error"] = str(exc)
                update_manifest(store, {"generation": stats})
                raise GenerationError(str(exc), stats) from None
            where = setup.placements
            works: Any = [[_work(cfg, plan, m, where[m], setup.groups.get(m)) for m in models]]
            backend: Any = RayBackend(store.uri, words)
        else:  # one model at a time: every model in memory at once would not fit
            works = ([_work(cfg, plan, model, None)] for model in models)
            backend = _local_backend(store, words)
        for group in works:
            grow = setup.grow if use_ray and setup is not None else None
            dispatchers.append(
                Dispatcher(
                    group, backend, policy, _fail_batch(store), bar.update, observer, grow=grow
                )
            )
            dispatchers[-1].run()
    finally:
        bar.close()
        if setup is not None:
            setup.release()
    stats["wall_s"] = round(time.perf_counter() - start, 3)
    stats["actors"] = [a for d in dispatchers for a in d.actor_stats()]
    stats["models"] = {
        w.model.id: _model_stats(w, stats["actors"]) for d in dispatchers for w in d.works
    }
    errors = [w.error for d in dispatchers for w in d.works if w.error]
    for d in dispatchers:  # methods that could not start: their jobs were written as errors
        for record, _ in d.records:
            for err in record.info.get("method_errors") or []:
                line = f"model {record.model}: {err} (its jobs are recorded as failed)"
                errors += [line] if line not in errors else []
    if errors:
        stats["errors"] = errors
        update_manifest(store, {"generation": stats})
        raise GenerationError("; ".join(errors), stats)
    return stats


def feed_chunk(batch_size: int, replicas: int) -> int:
    """Jobs per chunk a model's queue expands at a time: enough to keep its actors fed for a
    while (and batches sorted by prompt length within it), never more than a plan chunk."""
    return min(CHUNK_SIZE, max(1024, 8 * batch_size * PIPELINE * max(1, replicas)))


AUTO_GPU_BATCH = 256  # at most, on GPU replicas (their BatchSizer cuts what does not fit)


def on_gpu(where: Placement) -> bool:
    """Whether the replicas of `where` decode on a GPU (device "": this process's default,
    which `visible_gpus` tells without importing torch)."""
    if where.num_gpus > 0 or where.device == "auto" or where.device.startswith("cuda"):
        return True
    if where.device:
        return False
    return visible_gpus() > 0


def batch_jobs(size: int | str, where: Placement, pending: int) -> int:
    """Jobs per batch handed to one replica: `size`, or for `auto` 8 on CPU replicas and on GPU
    replicas up to AUTO_GPU_BATCH, fewer when the model's pending jobs would not give every
    replica PIPELINE batches (a GPU replica decodes what fits at once: `BatchSizer`)."""
    if size != "auto":
        return int(size)
    if not on_gpu(where):
        return AUTO_CPU_BATCH
    spread = -(-pending // (PIPELINE * max(1, where.replicas)))
    return max(AUTO_CPU_BATCH, min(AUTO_GPU_BATCH, spread))


def _work(
    cfg: RunConfig,
    plan: Plan,
    model: ModelRef,
    where: Placement | None,
    groups: list[Any] | None = None,
) -> ModelWork:
    """The model's queue, fed lazily from `plan`; `where` None: in this process (no Ray).
    `groups`: the reservations of its replicas, one per slot."""
    here = where or Placement(1, 0.0, 0.0, cfg.runtime.device or "")
    pending = plan.pending_of(model)
    size = batch_jobs(cfg.runtime.batch_size, here, pending)
    gpu = " on GPU replicas" if on_gpu(here) else ""
    log.info(
        f"generate {model.id}: batches of {size} jobs{gpu} "
        f"(runtime.batch_size: {cfg.runtime.batch_size})"
    )
    return ModelWork(
        model,
        plan.method_keys(model),
        here,
        collections.deque(),
        total=pending,
        source=plan.batches(model, size, feed_chunk(size, here.replicas)),
        batch_size=size,
        groups=list(groups or []),
    )


def _warn_local_run_dir(store: RunStore) -> None:
    from harness.stages.generation.ray_runtime import alive_nodes

    if store.local and alive_nodes() > 1:
        log.warning(
            "run directory %s is a local path on a cluster of %d nodes: actors on other "
            "nodes can write there only if it is a shared filesystem (else use s3:// or "
            "gs://)",
            store.uri,
            alive_nodes(),
        )


def _local_backend(store: RunStore, words: GroupWords) -> LocalBackend:
    def build(spec: Any) -> Any:
        from workers.generator import Generator

        p = spec.placement
        return Generator(
            spec.model,
            store.uri,
            words=words,
            device=p.device or None,
            name=spec.name,
            gpu_share=p.num_gpus,
        )

    return LocalBackend(build)


def _fail_batch(store: RunStore) -> Any:
    def fail(batch: Batch, error: str) -> int:
        """Error rows for the jobs of `batch` that no attempt wrote an ok row for."""
        return store.write_failed([failed_row(j, error) for j in batch])

    return fail


def _model_stats(work: ModelWork, actors: list[dict[str, Any]]) -> dict[str, Any]:
    mine = [a for a in actors if a["model"] == work.model.id]
    return {
        "jobs": work.total,
        "done": work.done,
        "failed": work.failed,
        "pending": work.total - work.done - work.failed,
        "actors_started": len(mine),
        "actor_deaths": sum(1 for a in mine if str(a["end"]).startswith("died")),
        # slots whose actor became ready: grown past the plan (`runtime.gpus: auto`), or fewer
        "replicas": len({_slot(a["worker"]) for a in mine if a.get("load_s") is not None}),
        "replicas_planned": work.placement.replicas,
        "num_gpus": work.placement.num_gpus,
        "batch_size": work.batch_size,
        # largest measured peak GPU memory per sequence over its replicas (None: CPU)
        "peak_bytes_per_seq": max((a.get("peak_bytes_per_seq") or 0 for a in mine), default=0)
        or None,
        "error": work.error,
    }


def _slot(worker: str) -> str:
    """The slot of an actor named `<model>#<slot>[.<restart>]` (model ids may hold dots)."""
    return worker.rpartition("#")[2].partition(".")[0]


def failed_row(job: JobSpec, error: str) -> dict[str, Any]:
    """An error row for a job whose batch could not be generated (no torch needed)."""
    return error_row(job.to_row(), f"job {job.job_id}: {error}")

"""The generation stage: pending jobs → per-model queues of batches → actors → shards.

`generate_stage` plans the placement of each model (how many replicas, which resources, which
device), then hands the queues to a `harness.dispatch.Dispatcher` over Ray actors (or over
plain `Generator`s in this process with `--no-ray`). Each model's queue pulls its batches
lazily from the plan (`harness.planning.Plan.batches`: the model's pending slices expanded
again, a chunk at a time), so the driver holds about one chunk of jobs per model whatever the
size of the grid. Actors write their shards themselves; the stage writes only the error rows
of batches that failed every retry. Per-actor throughput and utilisation go to the manifest.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import Any

from harness.backends import Batch, LocalBackend, MethodKey, Placement, RayBackend
from harness.config import ModelConfig, RunConfig
from harness.dispatch import PIPELINE, Dispatcher, ModelWork, Observer, Policy
from harness.manifest import update_manifest
from harness.planning import Plan
from harness.progress import Progress
from jobs.grid import CHUNK_SIZE
from jobs.spec import JobSpec, ModelRef
from jobs.words import GroupWords
from results.schema import error_row
from results.store import RunStore

log = logging.getLogger("harness")


class GenerationError(RuntimeError):
    """A model that cannot run (bad id, no actor could start: its jobs stay pending), or a
    method that could not start (its jobs are error rows). `stats` is the stage's stats."""

    def __init__(self, message: str, stats: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.stats = stats or {}


def method_keys(jobs: Sequence[JobSpec]) -> list[MethodKey]:
    return sorted({(j.method, j.method_params, j.task) for j in jobs})


def gpu_share(mc: ModelConfig, device: str | None) -> float:
    """GPUs per replica: the model's `num_gpus`, else 1 (0 with `runtime.device: cpu`)."""
    if mc.num_gpus is not None:
        return mc.num_gpus
    return 0.0 if device == "cpu" else 1.0


def placement(mc: ModelConfig, cluster_gpus: float, device: str | None) -> Placement:
    """Replicas and resources of one model: by default one replica per GPU of `cluster_gpus`.

    `cluster_gpus` is the GPU budget (`runtime.gpus`) or the GPUs the cluster has. `num_gpus`
    below 1 packs several replicas on a GPU; above 1 gives one replica several GPUs, loaded
    with `device_map="auto"` over the GPUs Ray assigned to it. Without GPUs (and without
    `num_gpus`): CPU replicas of `num_cpus` CPUs each, torch running that many threads.
    `replicas` overrides the count. Callers in cluster mode never pass 0 GPUs for a model that
    wants some: they wait for GPUs first (`plan_placements`).
    """
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


def plan_placements(cfg: RunConfig, models: Sequence[ModelRef]) -> dict[ModelRef, Placement]:
    """The placement of each model; in cluster mode asks for the GPUs and waits for them.

    Local Ray (started by this process): the GPUs it has are all there is; none means CPU
    replicas, said in a warning. Cluster mode: GPU models ask the autoscaler for their replicas
    (`replicas`, else the budget `runtime.gpus`, else one) and wait up to `runtime.gpu_wait_s`
    for them; with fewer GPUs than one replica needs, `GenerationError`, never CPU. Only
    `runtime.device: cpu` (or `num_gpus: 0`) places a model on CPUs.
    """
    from harness.ray_runtime import (
        NoGpuError,
        cluster_gpus,
        cluster_mode,
        request_gpus,
        wait_for_gpus,
    )

    rt = cfg.runtime
    configs = {m: _model_config(cfg, m) for m in models}
    have = cluster_gpus()
    shares = {m: gpu_share(mc, rt.device) for m, mc in configs.items()}
    gpu_models = [m for m in models if shares[m] > 0]
    if not cluster_mode() or not gpu_models:
        if (
            have == 0
            and gpu_models
            and rt.device is None
            and not any(configs[m].num_gpus for m in gpu_models)
        ):
            log.warning("this local Ray has no GPU: generation runs on CPU (runtime.device)")
        budget = min(float(rt.gpus), have) if rt.gpus and have else have
        return {m: placement(mc, budget, rt.device) for m, mc in configs.items()}
    bundles: list[float] = []
    for m in gpu_models:
        mc = configs[m]
        count = mc.replicas or (int(rt.gpus // shares[m]) if rt.gpus else 0)
        if not count:  # no share given: the GPUs there now, at least one replica
            count = max(1, int(have // shares[m]))
        bundles += [shares[m]] * max(1, count)
    want = float(rt.gpus) if rt.gpus else sum(bundles)
    request_gpus(bundles)
    what = "generation of " + ", ".join(m.id for m in gpu_models)
    try:
        have = wait_for_gpus(want, max(shares.values()), rt.gpu_wait_s, what)
    except NoGpuError as exc:
        raise GenerationError(str(exc)) from None
    budget = float(rt.gpus) if rt.gpus else have
    return {m: placement(mc, budget, rt.device) for m, mc in configs.items()}


def _model_config(cfg: RunConfig, model: ModelRef) -> ModelConfig:
    return next(m for m in cfg.models if m.ref() == model)


def generate_stage(
    store: RunStore,
    cfg: RunConfig,
    jobs: Sequence[JobSpec] | Plan,
    words: GroupWords,
    use_ray: bool = True,
    progress: bool = True,
    retry_failed: bool = False,
    observer: Observer | None = None,
) -> dict[str, Any]:
    """Generate every planned job that has no row yet; returns the stats for the manifest.

    `jobs`: the `Plan` of the plan stage (streamed: its counts and done ids are reused), or a
    list of jobs (then the done ids are read here; `retry_failed` applies to them).

    Raises `GenerationError` (after the other models are done and the manifest is written)
    when a model could not run at all, or a method could not start; its `stats` are the
    stage's stats.
    """
    plan = jobs if isinstance(jobs, Plan) else _list_plan(store, jobs, retry_failed)
    stats: dict[str, Any] = {
        "planned": plan.planned,
        "pending_at_start": plan.pending,
        "actors": [],
        "models": {},
    }
    if not plan.pending:
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
                where = plan_placements(cfg, models)
            except GenerationError as exc:
                stats["error"] = str(exc)
                update_manifest(store, {"generation": stats})
                raise GenerationError(str(exc), stats) from None
            works = [_work(cfg, plan, m, where[m]) for m in models]
            dispatchers.append(
                Dispatcher(
                    works,
                    RayBackend(store.uri, words),
                    policy,
                    _fail_batch(store),
                    bar.update,
                    observer,
                )
            )
            dispatchers[-1].run()
        else:  # one model at a time: every model in memory at once would not fit
            for model in models:
                dispatchers.append(
                    Dispatcher(
                        [_work(cfg, plan, model, None)],
                        _local_backend(store, words),
                        policy,
                        _fail_batch(store),
                        bar.update,
                        observer,
                    )
                )
                dispatchers[-1].run()
    finally:
        bar.close()
        if use_ray:
            _withdraw_gpu_request()
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


def _list_plan(store: RunStore, jobs: Sequence[JobSpec], retry_failed: bool) -> Plan:
    return Plan.from_jobs(jobs, store.done_ids(include_errors=not retry_failed))


def feed_chunk(batch_size: int, replicas: int) -> int:
    """Jobs per chunk a model's queue expands at a time: enough to keep its actors fed for a
    while (and batches sorted by prompt length within it), never more than a plan chunk."""
    return min(CHUNK_SIZE, max(1024, 8 * batch_size * PIPELINE * max(1, replicas)))


AUTO_CPU_BATCH = 8  # runtime.batch_size auto on CPU replicas
AUTO_GPU_BATCH = 256  # at most, on GPU replicas (their BatchSizer cuts what does not fit)


def on_gpu(where: Placement) -> bool:
    """Whether the replicas of `where` decode on a GPU (device "": this process's default)."""
    if where.num_gpus > 0 or where.device == "auto" or where.device.startswith("cuda"):
        return True
    if where.device:
        return False
    import torch

    return bool(torch.cuda.is_available())


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


def _work(cfg: RunConfig, plan: Plan, model: ModelRef, where: Placement | None) -> ModelWork:
    """The model's queue, fed lazily from `plan`; `where` None: in this process (no Ray)."""
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
    )


def _warn_local_run_dir(store: RunStore) -> None:
    from harness.ray_runtime import alive_nodes

    if store.local and alive_nodes() > 1:
        log.warning(
            "run directory %s is a local path on a cluster of %d nodes: actors on other "
            "nodes can write there only if it is a shared filesystem (else use s3:// or "
            "gs://)",
            store.uri,
            alive_nodes(),
        )


def _withdraw_gpu_request() -> None:
    from harness.ray_runtime import cluster_mode, request_gpus

    if cluster_mode():
        request_gpus([])  # idle GPU nodes may go after idle_timeout_minutes


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
        "replicas": work.placement.replicas,
        "num_gpus": work.placement.num_gpus,
        "batch_size": work.batch_size,
        # largest measured peak GPU memory per sequence over its replicas (None: CPU)
        "peak_bytes_per_seq": max((a.get("peak_bytes_per_seq") or 0 for a in mine), default=0)
        or None,
        "error": work.error,
    }


def failed_row(job: JobSpec, error: str) -> dict[str, Any]:
    """An error row for a job whose batch could not be generated (no torch needed)."""
    return error_row(job.to_row(), f"job {job.job_id}: {error}")


def actor_lines(manifest: dict[str, Any]) -> list[str]:
    """`status` lines: per model, the actors of the last generation run and their throughput."""
    actors = (manifest.get("generation") or {}).get("actors") or []
    by_model: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for actor in actors:
        by_model[actor["model"]].append(actor)
    lines = []
    for model, mine in by_model.items():
        died = sum(1 for a in mine if str(a.get("end", "")).startswith("died"))
        busy = [a["utilisation"] for a in mine if a.get("utilisation") is not None]
        util = f"{sum(busy) / len(busy):.0%}" if busy else "-"
        jobs = sum(a.get("jobs", 0) for a in mine)
        lines.append(
            f"  {model}: last run {len(mine)} actor(s) ({died} died), {jobs} jobs, "
            f"mean utilisation {util} (manifest.json has each actor)"
        )
    return lines

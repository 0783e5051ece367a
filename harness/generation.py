"""The generation stage: pending jobs → per-model queues of batches → actors → shards.

`generate_stage` plans the placement of each model (how many replicas, which resources, which
device), then hands the queues to a `harness.dispatch.Dispatcher` over Ray actors (or over
plain `Generator`s in this process with `--no-ray`). Actors write their shards themselves; the
stage writes only the error rows of batches that failed every retry. Per-actor throughput and
utilisation go to the manifest.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Sequence
from typing import Any

from harness.backends import Batch, LocalBackend, MethodKey, Placement, RayBackend
from harness.config import ModelConfig, RunConfig
from harness.dispatch import Dispatcher, ModelWork, Observer, Policy
from harness.manifest import update_manifest
from harness.progress import Progress
from jobs.queue import make_batches, pending
from jobs.spec import JobSpec, ModelRef
from jobs.words import GroupWords
from results.schema import error_row
from results.store import RunStore

log = logging.getLogger("harness")


class GenerationError(RuntimeError):
    """A model that cannot run (bad id, missing head, no actor could start): its jobs stay pending."""


def method_keys(jobs: Sequence[JobSpec]) -> list[MethodKey]:
    return sorted({(j.method, j.method_params, j.task) for j in jobs})


def placement(mc: ModelConfig, cluster_gpus: float, device: str | None) -> Placement:
    """Replicas and resources of one model: by default one replica per GPU of the cluster.

    `num_gpus` below 1 packs several replicas on a GPU; above 1 gives one replica several GPUs,
    loaded with `device_map="auto"` over the GPUs Ray assigned to it. Without GPUs: one CPU
    replica (torch already uses every core of a node). `replicas` overrides the count, e.g. on
    an autoscaling cluster whose GPU nodes are not up yet.
    """
    per_replica = mc.num_gpus if mc.num_gpus is not None else (1.0 if cluster_gpus >= 1 else 0.0)
    if per_replica > 0:
        replicas = mc.replicas or max(1, int(cluster_gpus // per_replica))
        return Placement(
            replicas, per_replica, 1.0, device or ("auto" if per_replica > 1 else "cuda")
        )
    return Placement(mc.replicas or 1, 0.0, 1.0, device or "cpu")


def generate_stage(
    store: RunStore,
    cfg: RunConfig,
    jobs: list[JobSpec],
    words: GroupWords,
    use_ray: bool = True,
    progress: bool = True,
    retry_failed: bool = False,
    observer: Observer | None = None,
) -> dict[str, Any]:
    """Generate every planned job that has no row yet; returns the stats for the manifest.

    Raises `GenerationError` (after the other models are done and the manifest is written)
    when a model could not run at all.
    """
    todo = pending(jobs, store.done_ids(include_errors=not retry_failed))
    stats: dict[str, Any] = {
        "planned": len(jobs),
        "pending_at_start": len(todo),
        "actors": [],
        "models": {},
    }
    if not todo:
        return stats
    by_model: dict[ModelRef, list[JobSpec]] = collections.defaultdict(list)
    for job in todo:
        by_model[job.model].append(job)
    bar = Progress("generate", total=len(jobs), done=len(jobs) - len(todo), enabled=progress)
    rt = cfg.runtime
    policy = Policy(
        rt.max_batch_retries, rt.max_actor_restarts, rt.actor_start_timeout_s, rt.progress_log_s
    )
    start = time.perf_counter()
    dispatchers: list[Dispatcher] = []
    try:
        if use_ray:
            works = _works(cfg, by_model, _cluster_gpus(store), in_process=False)
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
            for work in _works(cfg, by_model, 0.0, in_process=True):
                dispatchers.append(
                    Dispatcher(
                        [work],
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
        update_manifest(store, {"generation": stats})
        raise GenerationError("; ".join(errors))
    return stats


def _works(
    cfg: RunConfig, by_model: dict[ModelRef, list[JobSpec]], gpus: float, in_process: bool
) -> list[ModelWork]:
    works = []
    for model, jobs in by_model.items():
        mc = next(m for m in cfg.models if m.ref() == model)
        if in_process:
            where = Placement(1, 0.0, 0.0, cfg.runtime.device or "")
        else:
            where = placement(mc, gpus, cfg.runtime.device)
        batches = collections.deque((b, 0) for b in make_batches(jobs, cfg.runtime.batch_size))
        works.append(ModelWork(model, method_keys(jobs), where, batches, total=len(jobs)))
    return works


def _cluster_gpus(store: RunStore) -> float:
    import ray

    from harness.ray_runtime import alive_nodes

    if store.local and alive_nodes() > 1:
        log.warning(
            "run directory %s is a local path on a cluster of %d nodes: actors on other "
            "nodes can write there only if it is a shared filesystem (else use s3:// or "
            "gs://)",
            store.uri,
            alive_nodes(),
        )
    return float(ray.cluster_resources().get("GPU", 0))


def _local_backend(store: RunStore, words: GroupWords) -> LocalBackend:
    def build(spec: Any) -> Any:
        from workers.generator import Generator

        device = spec.placement.device or None
        return Generator(spec.model, store.uri, words=words, device=device, name=spec.name)

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

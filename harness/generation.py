"""The generation stage: pending jobs → batches → generation actors → shards.

Work is handed out from a queue, at most `PIPELINE` batches in flight per actor, so a slow
actor never holds the others idle. An actor that dies is restarted by Ray (`max_restarts`) and
its batch retried up to `max_batch_retries` times; a batch that keeps failing is written as
error rows naming the job and the error, and the run finishes the rest.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

from harness.config import RunConfig
from harness.progress import Progress
from jobs.queue import make_batches, pending
from jobs.spec import JobSpec, ModelRef
from jobs.words import GroupWords
from results.store import RunStore

log = logging.getLogger("harness")
PIPELINE = 2  # batches in flight per actor: the next one is queued while one runs


class GenerationError(RuntimeError):
    """A model or method that cannot start (bad id, missing head...): nothing was generated."""


def method_keys(jobs: list[JobSpec]) -> list[tuple[str, str, str]]:
    return sorted({(j.method, j.method_params, j.task) for j in jobs})


def generate_stage(
    store: RunStore, cfg: RunConfig, jobs: list[JobSpec], words: GroupWords,
    use_ray: bool = True, progress: bool = True,
) -> dict[str, Any]:
    todo = pending(jobs, store.done_job_ids())
    stats: dict[str, Any] = {"planned": len(jobs), "pending_at_start": len(todo), "actors": []}
    if not todo:
        return stats
    bar = Progress("generate", total=len(jobs), done=len(jobs) - len(todo), enabled=progress)
    by_model: dict[ModelRef, list[JobSpec]] = collections.defaultdict(list)
    for job in todo:
        by_model[job.model].append(job)
    start = time.perf_counter()
    if use_ray:
        stats["actors"] = _run_on_ray(store, cfg, by_model, words, bar)
    else:
        stats["actors"] = _run_in_process(store, cfg, by_model, words, bar)
    bar.close()
    wall = time.perf_counter() - start
    for actor in stats["actors"]:
        actor["utilisation"] = round(actor.get("busy_s", 0.0) / wall, 3) if wall > 0 else None
    stats["wall_s"] = wall
    return stats


def _run_in_process(store: RunStore, cfg: RunConfig, by_model: dict[ModelRef, list[JobSpec]],
                    words: GroupWords, bar: Progress) -> list[dict[str, Any]]:
    from workers.generator import Generator

    out = []
    for model, jobs in by_model.items():
        gen = Generator(model, store.uri, words=words, device=cfg.runtime.device, name=f"{model.id}#0")
        try:
            gen.prepare(method_keys(jobs))
        except Exception as exc:
            raise GenerationError(f"model {model.id}: {exc}") from exc
        for batch in make_batches(jobs, cfg.runtime.batch_size):
            result = gen.run_batch(batch)
            bar.update(result["jobs"], result["ok"])
        out.append(dict(gen.stats, worker=gen.name))
    return out


def _replicas(cfg: RunConfig, model: ModelRef, gpus: float) -> tuple[int, dict[str, float]]:
    mc = next(m for m in cfg.models if m.ref() == model)
    per_gpu = mc.num_gpus if mc.num_gpus is not None else (1.0 if gpus >= 1 else 0.0)
    if per_gpu > 0:
        n = mc.replicas or max(1, int(gpus // per_gpu))
        return n, {"num_gpus": per_gpu, "num_cpus": 1}
    return mc.replicas or 1, {"num_cpus": 1}


def _run_on_ray(store: RunStore, cfg: RunConfig, by_model: dict[ModelRef, list[JobSpec]],
                words: GroupWords, bar: Progress) -> list[dict[str, Any]]:
    import ray

    from workers.actors import GenerationActor

    gpus = float(ray.cluster_resources().get("GPU", 0))
    actors: list[Any] = []
    queues: dict[ModelRef, collections.deque[tuple[list[JobSpec], int]]] = {}
    owner: dict[Any, ModelRef] = {}
    for model, jobs in by_model.items():
        n, resources = _replicas(cfg, model, gpus)
        device = cfg.runtime.device or ("cuda" if resources.get("num_gpus", 0) > 0 else "cpu")
        queues[model] = collections.deque((b, 0) for b in make_batches(jobs, cfg.runtime.batch_size))
        for i in range(min(n, len(queues[model]))):
            actor = GenerationActor.options(max_restarts=2, **resources).remote(  # type: ignore[attr-defined]
                model, store.uri, words, device, f"{model.id}#{i}"
            )
            actors.append(actor)
            owner[actor] = model
    _wait_ready(actors, owner, by_model, cfg.runtime.actor_start_timeout_s)
    inflight: dict[Any, tuple[Any, list[JobSpec], int]] = {}

    def submit(actor: Any) -> None:
        queue = queues[owner[actor]]
        while queue and sum(1 for a, _, _ in inflight.values() if a is actor) < PIPELINE:
            batch, attempts = queue.popleft()
            inflight[actor.run_batch.remote(batch)] = (actor, batch, attempts)

    for actor in actors:
        submit(actor)
    while inflight:
        done, _ = ray.wait(list(inflight), num_returns=1)
        actor, batch, attempts = inflight.pop(done[0])
        try:
            result = ray.get(done[0])
            bar.update(result["jobs"], result["ok"])
        except Exception as exc:  # actor died, or the batch raised
            _retry_or_fail(store, queues[owner[actor]], batch, attempts, exc, cfg.runtime.max_batch_retries, bar)
        submit(actor)
    return _collect_stats(actors)


def _wait_ready(actors: list[Any], owner: dict[Any, ModelRef], by_model: dict[ModelRef, list[JobSpec]],
                timeout: float) -> None:
    import ray

    refs = {a.prepare.remote(method_keys(by_model[owner[a]])): a for a in actors}
    ready, not_ready = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    if not_ready:
        names = sorted({owner[refs[r]].id for r in not_ready})
        raise GenerationError(
            f"generation actors for {names} not ready after {timeout:.0f}s: the cluster may lack the "
            "resources they ask for (GPUs?); see runtime.actor_start_timeout_s"
        )
    for ref in ready:
        try:
            ray.get(ref)
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise GenerationError(f"model {owner[refs[ref]].id}: {cause}") from None


def _retry_or_fail(store: RunStore, queue: collections.deque[tuple[list[JobSpec], int]], batch: list[JobSpec],
                   attempts: int, exc: Exception, max_retries: int, bar: Progress) -> None:

    cause = getattr(exc, "cause", None) or exc
    if attempts < max_retries:
        log.warning("batch of %d jobs failed (%s); retry %d/%d", len(batch), type(cause).__name__,
                    attempts + 1, max_retries)
        queue.appendleft((batch, attempts + 1))
        time.sleep(min(2.0 ** attempts, 10.0))
        return
    message = f"{type(cause).__name__}: {cause}"
    log.error("batch of %d jobs failed %d times; recording them as failed: %s", len(batch), attempts + 1, message)
    store.write_generations([failed_row(j, message) for j in batch])
    bar.update(len(batch), 0)


def failed_row(job: JobSpec, error: str) -> dict[str, Any]:
    """An error row for a job whose batch could not be generated (no torch needed)."""
    row = job.to_row()
    row.update(continuation="", num_tokens=0, token_ids=[], tokens=[], finish_reason="error", status="error",
               error=f"job {job.job_id}: {error}", choices=None, loss_g=None, loss_a=None,
               elidao_fallback=None, elidao_gender=None, effective_params=None, worker=None, elapsed_s=None)
    return row


def _collect_stats(actors: list[Any]) -> list[dict[str, Any]]:
    import ray

    out = []
    for actor in actors:
        try:
            out.append(ray.get(actor.stats.remote(), timeout=30))
        except Exception as exc:  # a dead actor has no stats; say so
            out.append({"worker": "unknown", "error": f"{type(exc).__name__}"})
    return out

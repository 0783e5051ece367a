"""The orchestrator: plan → generate → score → aggregate, each a function found by name.

The driver never imports torch or transformers; models load inside Ray actors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from harness.config import (
    GenerationConfig,
    ModelConfig,
    RunConfig,
    check_grid_size,
    dump_config,
)
from harness.generation import generate_stage
from harness.manifest import update_manifest
from harness.scoring import pool_settings, score_run
from jobs.datasets import Prompt, load_paired_jsonl, load_prompt_list
from jobs.grid import CHUNK_SIZE, PlanChunk, expand_grid, iter_plan
from jobs.spec import JobSpec
from jobs.words import GroupWords, load_group_words
from results.store import RunStore
from workers.scorers.base import ScorerContext

log = logging.getLogger("harness")


def load_words(cfg: RunConfig) -> GroupWords:
    return load_group_words(
        cfg.gender_words, sha256=cfg.gender_words_sha256, cache_dir=cfg.runtime.cache_dir
    )


def load_prompts(cfg: RunConfig, words: GroupWords) -> list[Prompt]:
    ds = cfg.dataset
    if ds.kind == "paired-jsonl":
        assert ds.files is not None
        return load_paired_jsonl(
            ds.files, limit=ds.limit, sha256=ds.sha256, cache_dir=cfg.runtime.cache_dir
        )
    assert ds.path is not None
    sha = (ds.sha256 or {}).get("path")
    return load_prompt_list(
        ds.path, ds.text_field, ds.limit, words, sha256=sha, cache_dir=cfg.runtime.cache_dir
    )


def generation_for(cfg: RunConfig, model: ModelConfig) -> GenerationConfig:
    """The model's own `generation`, else the run's, with the paper's sampling parameters as the
    defaults for a model the paper ran (e.g. OPT-6.7B: temperature 0.75, repetition penalty 1.2)."""
    if model.generation is not None:
        return model.generation
    from workers.methods.registry import paper_generation

    paper = paper_generation(model.id)
    given = {k: getattr(cfg.generation, k) for k in cfg.generation.model_fields_set}
    if "generation" not in cfg.model_fields_set:
        given = {}
    return GenerationConfig(**{**cfg.generation.model_dump(), **paper, **given})


def plan(cfg: RunConfig, words: GroupWords) -> list[JobSpec]:
    """Every job of the config's grid (validated input; nothing runs yet)."""
    prompts = load_prompts(cfg, words)
    check_grid_size(cfg, len(prompts))  # refuse before building a grid too large to hold
    models = [(m.ref(), generation_for(cfg, m).params()) for m in cfg.models]
    methods = [(m.name, dict(m.params)) for m in cfg.methods]
    heads = {m.ref(): {str(t): h for t, h in m.heads.items()} for m in cfg.models}
    return expand_grid(
        prompts, models, methods, list(cfg.tasks), cfg.samples_per_prompt, heads=heads
    )


def write_plan(store: RunStore, cfg: RunConfig, jobs: list[JobSpec]) -> None:
    store.makedirs()
    store.write_bytes("config.yaml", dump_config(cfg).encode())
    store.write_plan_jobs(jobs[i : i + CHUNK_SIZE] for i in range(0, len(jobs), CHUNK_SIZE))


def plan_chunks(cfg: RunConfig, words: GroupWords) -> Iterator[PlanChunk]:
    """`plan` as a stream of per-slice chunks (memory: one chunk of `JobSpec`s at a time)."""
    prompts = load_prompts(cfg, words)
    models = [(m.ref(), generation_for(cfg, m).params()) for m in cfg.models]
    methods = [(m.name, dict(m.params)) for m in cfg.methods]
    heads = {m.ref(): {str(t): h for t, h in m.heads.items()} for m in cfg.models}
    return iter_plan(
        prompts, models, methods, list(cfg.tasks), cfg.samples_per_prompt, heads=heads
    )


def score_stage(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    use_ray: bool,
    only: list[str] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    scorers = [(s.name, dict(s.params)) for s in cfg.scorers if not only or s.name in only]
    context = ScorerContext(words=words, cache_dir=cfg.runtime.cache_dir, device=cfg.runtime.device)
    batch = cfg.runtime.score_batch_size
    stats = score_run(
        store,
        scorers,
        context,
        use_ray,
        batch_size=batch,
        progress=progress,
        start_timeout_s=cfg.runtime.actor_start_timeout_s,
        pools=pool_settings(cfg),
    )
    update_manifest(store, {"scoring": stats})
    return stats


def first_scorer_per_metric(cfg: RunConfig) -> list[str]:
    """The config's scorers, keeping the first listed for each metric (what `run` aggregates)."""
    from workers.scorers.registry import SCORER_METRICS

    chosen: dict[str, str] = {}
    for s in cfg.scorers:
        chosen.setdefault(SCORER_METRICS[s.name], s.name)
    return list(chosen.values())


def aggregate_stage(store: RunStore, use: list[str] | None = None, **options: Any) -> Any:
    """Summary and reports; `use` names the scorer to read where several gave one metric;
    `options` (ppl_max, n_boot, seed) override the run config's `aggregation:`."""
    from results.aggregate import aggregate_run
    from results.join import scorer_choice

    return aggregate_run(store, scorers=scorer_choice(use) if use else None, **options)


def run(
    cfg: RunConfig,
    out: str,
    use_ray: bool = True,
    progress: bool = True,
    retry_failed: bool = False,
) -> dict[str, Any]:
    """The whole pipeline on `cfg` into run directory `out`; resumes what is already there.

    Jobs that ended with an error count as done unless `retry_failed`.
    """
    store = RunStore(out)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    words = load_words(cfg)
    jobs = plan(cfg, words)
    write_plan(store, cfg, jobs)
    timings["plan_s"] = time.perf_counter() - t0
    log.info("planned %d jobs into %s", len(jobs), store.uri)
    t0 = time.perf_counter()
    gen_stats = generate_stage(
        store, cfg, jobs, words, use_ray=use_ray, progress=progress, retry_failed=retry_failed
    )
    store.compact_generations()  # one shard per batch → shards of ~50k rows
    timings["generate_s"] = time.perf_counter() - t0
    update_manifest(store, {"generation": gen_stats, "timings": timings})
    t0 = time.perf_counter()
    score_stats = score_stage(store, cfg, words, use_ray=use_ray, progress=progress)
    timings["score_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    aggregate_stage(store, use=first_scorer_per_metric(cfg))
    timings["aggregate_s"] = time.perf_counter() - t0
    update_manifest(store, {"timings": timings})
    return {"jobs": len(jobs), "generation": gen_stats, "scoring": score_stats, "timings": timings}

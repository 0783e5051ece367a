"""The orchestrator: plan → generate → score → aggregate, each a function found by name.

The driver never imports torch or transformers; models load inside Ray actors. `run` streams
the plan: `plan_stage` checks, writes and counts it in one pass over the grid, and the
generation stage expands each model's pending slices again as its actors need batches
(`harness.stages.planning`), so the driver's memory does not grow with the number of jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from harness.config import (
    ConfigError,
    GenerationConfig,
    ModelConfig,
    RunConfig,
    ScorerConfig,
    check_grid_size,
    dump_config,
    load_yaml,
)
from harness.stages.generation import GenerationError, Setup, generate_stage, reserve_generation
from harness.stages.planning import ChunkSource, Plan, plan_pass
from harness.stages.ray_runtime import bind_run, reassert_signal_handlers
from harness.stages.score_follow import Followed, following, pool_wants_gpu
from harness.stages.score_settings import Share, pool_settings
from harness.stages.scoring import ScoringError, score_run
from jobs.datasets import Prompt, load_paired_jsonl, load_prompt_list
from jobs.grid import CHUNK_SIZE, PlanChunk, SliceKey, expand_grid, iter_plan
from jobs.spec import JobSpec
from jobs.words import GroupWords, load_group_words
from results.run.history import Invocation
from results.run.manifest import update_manifest
from results.run.store import RunStore
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
    from jobs.catalog import paper_generation

    paper = paper_generation(model.id)
    given = {k: getattr(cfg.generation, k) for k in cfg.generation.model_fields_set}
    if "generation" not in cfg.model_fields_set:
        given = {}
    return GenerationConfig(**{**cfg.generation.model_dump(), **paper, **given})


def grid_axes(cfg: RunConfig) -> tuple[list[Any], list[Any], dict[Any, dict[str, str]]]:
    """(models with their sampling parameters, methods with theirs, heads per model and task)."""
    models = [(m.ref(), generation_for(cfg, m).params()) for m in cfg.models]
    methods = [(m.name, dict(m.params)) for m in cfg.methods]
    heads = {m.ref(): {str(t): h for t, h in m.heads.items()} for m in cfg.models}
    return models, methods, heads


def plan(cfg: RunConfig, words: GroupWords) -> list[JobSpec]:
    """Every job of the config's grid as one list (tests and small tools; `run` streams)."""
    prompts = load_prompts(cfg, words)
    check_grid_size(cfg, len(prompts))  # refuse before building a grid too large to hold
    models, methods, heads = grid_axes(cfg)
    return expand_grid(
        prompts, models, methods, list(cfg.tasks), cfg.samples_per_prompt, heads=heads
    )


def config_snapshot(store: RunStore, cfg: RunConfig) -> str:
    """config.yaml for `cfg` (secrets redacted), keeping the scorers the run's snapshot records
    and `cfg` lacks: those `score` added (`record_scorers`); their scores stay in the run, so a
    re-run of the original config must not drop the record of how they were computed."""
    if store.exists("config.yaml"):
        import yaml

        from harness.config import parse_config

        try:
            old = parse_config(
                yaml.safe_load(store.read_text("config.yaml")), f"{store.uri}/config.yaml"
            )
        except (ConfigError, OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            log.warning("%s/config.yaml could not be read (%s): rewritten", store.uri, exc)
        else:
            named = {s.name for s in cfg.scorers}
            extra = [s for s in old.scorers if s.name not in named]
            if extra:
                cfg = cfg.model_copy(update={"scorers": [*cfg.scorers, *extra]})
    return dump_config(cfg)


def write_plan(store: RunStore, cfg: RunConfig, jobs: list[JobSpec]) -> None:
    """config.yaml and plan.parquet of a plan held as a list (`run` streams it instead)."""
    store.makedirs()
    store.write_bytes("config.yaml", config_snapshot(store, cfg).encode())
    store.write_plan_jobs(jobs[i : i + CHUNK_SIZE] for i in range(0, len(jobs), CHUNK_SIZE))


def chunk_source(cfg: RunConfig, prompts: list[Prompt]) -> ChunkSource:
    """The grid of `cfg` over `prompts`, expandable again and again, slice by slice."""
    models, methods, heads = grid_axes(cfg)
    tasks = list(cfg.tasks)

    def source(only: Callable[[SliceKey], bool] | None, chunk_size: int) -> Iterator[PlanChunk]:
        return iter_plan(
            prompts,
            models,
            methods,
            tasks,
            cfg.samples_per_prompt,
            chunk_size=chunk_size,
            heads=heads,
            only=only,
        )

    return source


def plan_stage(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    replan: bool = False,
    retry_failed: bool = False,
) -> Plan:
    """Check the config's plan against the run's, write plan.parquet and config.yaml, and count
    planned and pending jobs: one streamed pass (`harness.stages.planning.plan_pass`).

    Jobs with an error row count as done unless `retry_failed`.

    Raises:
        results.run.identity.PlanChangedError: the config alters or drops planned jobs and
            `replan` is false (plan.parquet and config.yaml are left as they were).
    """
    prompts = load_prompts(cfg, words)
    check_grid_size(cfg, len(prompts))  # refuse before expanding a grid too large to run
    done = store.done_ids(include_errors=not retry_failed)
    the_plan = plan_pass(store, cfg, chunk_source(cfg, prompts), done, replan=replan)
    store.write_bytes("config.yaml", config_snapshot(store, cfg).encode())
    identity = the_plan.identity
    if identity["kind"] == "replan":
        log.warning(
            "--replan: %s now holds a new plan of %d jobs; the %d jobs of the old plan stay on "
            "disk, outside every count (changed: %s)",
            store.uri,
            the_plan.planned,
            identity["old_jobs"],
            "; ".join(identity["changed"]) or "-",
        )
    elif identity["kind"] == "extend":
        log.info("the config adds %d jobs to the plan of %s", identity["added"], store.uri)
    log.info("planned %d jobs into %s (%d pending)", the_plan.planned, store.uri, the_plan.pending)
    return the_plan


def generation_stage(
    store: RunStore,
    cfg: RunConfig,
    the_plan: Plan,
    words: GroupWords,
    use_ray: bool = True,
    progress: bool = True,
) -> tuple[dict[str, Any], GenerationError | None, Followed]:
    """Generate the plan's pending jobs, then compact the shards; returns (stats, error, the
    scorers that followed generation).

    Scorers that need no GPU score shards as they appear (`runtime.score_during_generation`,
    `harness.stages.score_follow`); the follower is stopped and joined before compaction, and its
    result goes to the final scoring pass. On Ray the generation replicas' GPUs are reserved
    first (`harness.stages.generation.reserve_generation`), so a scorer that follows can only take
    what the reservations leave. A `GenerationError` (a model that could not run, a method
    that could not start) is returned, not raised: what was generated is compacted, scored and
    aggregated all the same, and `run` raises the error at its end.
    """
    error: GenerationError | None = None
    setup: Setup | None = None
    stats: dict[str, Any] = {}
    if use_ray:
        reassert_signal_handlers()  # SIGTERM stays an interruption (`ray job stop`)
        bind_run(store)  # withdraws an autoscaler request a killed driver of this run left
        if the_plan.pending:
            try:
                setup = reserve_generation(cfg, the_plan.models())
            except GenerationError as exc:
                error = exc
                stats = {"planned": the_plan.planned, "pending_at_start": the_plan.pending}
                stats["error"] = str(exc)
    if error is not None:
        follow_result = Followed(use_ray=use_ray)
    else:
        growing = setup is not None and setup.grow is not None
        try:
            with following(
                store, follow_config(cfg, growing, the_plan.pending), words, use_ray=use_ray
            ) as follow:
                try:
                    stats = generate_stage(
                        store, cfg, the_plan, words, use_ray, progress, setup=setup
                    )
                except GenerationError as exc:
                    stats, error = dict(exc.stats), exc
                    stats.setdefault("planned", the_plan.planned)
                    stats.setdefault("pending_at_start", the_plan.pending)
        finally:
            if setup is not None:  # released by the stage; not if it never began
                setup.release()
        follow_result = follow.result
    store.compact_generations()  # one shard per batch → shards of ~50k rows
    update_manifest(store, {"generation": stats})
    return stats, error, follow_result


def follow_config(cfg: RunConfig, growing: bool, pending: int = 1) -> RunConfig:
    """The config the follower runs with: while generation grows onto GPU nodes that join
    (`runtime.gpus` unset), scorers on GPUs wait for the final pass, or a waiting scorer's
    actor could take a joining node's GPU before generation's new reservation does. With no
    job `pending` nothing follows: the final pass scores what is missing (started for a
    generation that ends at once, the scorers' actors were each reported "not ready")."""
    if not pending and cfg.runtime.score_during_generation is not False:
        runtime = cfg.runtime.model_copy(update={"score_during_generation": False})
        return cfg.model_copy(update={"runtime": runtime})
    if not growing or cfg.runtime.score_during_generation is not True:
        return cfg
    settings = pool_settings(cfg)
    on_gpu = [
        s.name
        for s in cfg.scorers
        if pool_wants_gpu(s.name, cfg.runtime.device, settings.shares.get(s.name, Share()))
    ]
    if not on_gpu:
        return cfg
    log.warning(
        "score_during_generation: scorer(s) %s hold GPUs: they score after generation, which "
        "keeps the GPU nodes that join for its replicas (runtime.gpus: auto); set "
        "runtime.gpus to score during generation",
        ", ".join(on_gpu),
    )
    runtime = cfg.runtime.model_copy(update={"score_during_generation": "auto"})
    return cfg.model_copy(update={"runtime": runtime})


def score_stage(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    use_ray: bool,
    only: list[str] | None = None,
    progress: bool = True,
    scorers: list[tuple[str, dict[str, Any]]] | None = None,
    followed: Followed | None = None,
) -> dict[str, Any]:
    """Score what is missing; `scorers` (name, params) replaces the config's list; `followed`:
    the scorers that scored during generation (`harness.stages.score_follow`), taken over."""
    if scorers is None:
        scorers = [(s.name, dict(s.params)) for s in cfg.scorers if not only or s.name in only]
    context = ScorerContext(words=words, cache_dir=cfg.runtime.cache_dir, device=cfg.runtime.device)
    batch = cfg.runtime.score_batch_size
    if use_ray:
        reassert_signal_handlers()
        bind_run(store)
    try:
        stats = score_run(
            store,
            scorers,
            context,
            use_ray,
            batch_size=batch,
            progress=progress,
            start_timeout_s=cfg.runtime.actor_start_timeout_s,
            pools=pool_settings(cfg),
            followed=followed,
        )
    except ScoringError as exc:
        update_manifest(store, {"scoring": exc.stats})
        raise
    update_manifest(store, {"scoring": stats})
    return stats


def scorers_to_run(
    cfg: RunConfig,
    names: list[str] | None,
    settings: list[str] | None = None,
    cache_only: bool = False,
) -> list[tuple[str, dict[str, Any]]]:
    """(name, params) of the scorers `score` runs, checked (names, parameter names) now.

    No names: the config's scorers. A named scorer the config lists keeps its parameters;
    any other registered scorer runs with its defaults. `settings` (`KEY=VALUE`, or
    `NAME.KEY=VALUE` with several names; values read as YAML) override parameters.

    Raises:
        ConfigError: an unknown scorer or parameter, or a malformed setting.
    """

    from workers.scorers.registry import check_scorer_name, load_scorer

    given = {s.name: dict(s.params) for s in cfg.scorers}
    chosen = list(dict.fromkeys(names)) if names else list(given)
    if not chosen:
        raise ConfigError("the run's config names no scorer: pass --scorer NAME")
    params: dict[str, dict[str, Any]] = {}
    for name in chosen:
        try:
            check_scorer_name(name)
        except KeyError as exc:
            raise ConfigError(f"--scorer: {exc.args[0]}") from None
        params[name] = dict(given.get(name, {}))
    for item in settings or []:
        key, eq, raw = item.partition("=")
        target, dot, field = key.rpartition(".")
        if not eq or not field or (not dot and len(chosen) != 1):
            raise ConfigError(
                f"--set {item!r}: expected KEY=VALUE (NAME.KEY=VALUE when several scorers run)"
            )
        target = target or chosen[0]
        if target not in params:
            raise ConfigError(f"--set {item!r}: {target!r} is not among the scorers {chosen}")
        params[target][field] = load_yaml(raw, f"--set {item!r}: the value")  # 1e-3: a float
    if cache_only:
        if "perspective" not in params:
            raise ConfigError("--cache-only applies to --scorer perspective only")
        params["perspective"]["cache_only"] = True
    for name, p in params.items():
        try:
            load_scorer(name).check_params(p)  # imports the module only: no torch here
        except (KeyError, ValueError) as exc:
            msg = exc.args[0] if exc.args else exc
            raise ConfigError(f"--scorer {name}: {msg}") from None
    return list(params.items())


def record_scorers(store: RunStore, scorers: list[tuple[str, dict[str, Any]]]) -> None:
    """Add scorers run by `score` to the config snapshot (secrets redacted), or update them."""
    if not store.exists("config.yaml"):
        return
    import yaml

    from harness.config import parse_config

    snap = parse_config(yaml.safe_load(store.read_text("config.yaml")), f"{store.uri}/config.yaml")
    entries = {s.name: s for s in snap.scorers}
    for name, params in scorers:
        entries[name] = ScorerConfig(name=name, params=params)
    updated = snap.model_copy(update={"scorers": list(entries.values())})
    text = dump_config(updated)
    if text != store.read_text("config.yaml"):
        store.write_bytes("config.yaml", text.encode())


def scorer_preference(
    cfg: RunConfig, named: list[str], present: list[str] | None = None
) -> list[str]:
    """One scorer per metric for aggregation: the ones just run first, then the config's
    (only those with scores in `present`, when given)."""
    from jobs.catalog import SCORER_METRICS

    chosen: dict[str, str] = {}
    for name in [*named, *(s.name for s in cfg.scorers)]:
        if present is None or name in present:
            chosen.setdefault(SCORER_METRICS[name], name)
    return list(chosen.values())


def first_scorer_per_metric(cfg: RunConfig) -> list[str]:
    """The config's scorers, keeping the first listed for each metric (what `run` aggregates)."""
    from jobs.catalog import SCORER_METRICS

    chosen: dict[str, str] = {}
    for s in cfg.scorers:
        chosen.setdefault(SCORER_METRICS[s.name], s.name)
    return list(chosen.values())


def aggregate_stage(store: RunStore, use: list[str] | None = None, **options: Any) -> Any:
    """Summary and reports; `use` names the scorer to read where several gave one metric;
    `options` (ppl_max, n_boot, seed) override the run config's `aggregation:`."""
    from results.report.build import aggregate_run
    from results.stats.join import scorer_choice
    from workers.tiny import report_tokenizer

    scorers = scorer_choice(use) if use else None
    return aggregate_run(store, scorers=scorers, tokenizer_for=report_tokenizer, **options)


def run(
    cfg: RunConfig,
    out: str,
    use_ray: bool = True,
    progress: bool = True,
    retry_failed: bool = False,
    replan: bool = False,
    invocation: Invocation | None = None,
) -> dict[str, Any]:
    """The whole pipeline on `cfg` into run directory `out`; resumes what is already there.

    Jobs that ended with an error count as done unless `retry_failed`. A config that alters
    or drops planned jobs raises `PlanChangedError` unless `replan` (see `results.run.identity`).
    Stage counts and timings go to `invocation` (the run record) as they finish.

    Raises:
        GenerationError: a model or method could not run. Everything that was generated is
            scored and aggregated first; the error is in the run record (its generation stage
            and `generation_error`).
    """
    store = RunStore(out)
    inv = invocation or Invocation("run")
    t0 = time.perf_counter()
    words = load_words(cfg)
    the_plan = plan_stage(store, cfg, words, replan=replan, retry_failed=retry_failed)
    if the_plan.identity["kind"] == "replan":
        inv.extra["replan"] = the_plan.identity
    inv.stage("plan", the_plan.identity, time.perf_counter() - t0)
    t0 = time.perf_counter()
    try:
        gen_stats, gen_error, followed = generation_stage(
            store, cfg, the_plan, words, use_ray=use_ray, progress=progress
        )
    finally:
        inv.timings["generate_s"] = round(time.perf_counter() - t0, 3)
    inv.stage("generation", gen_stats, time.perf_counter() - t0)
    if gen_error is not None:
        inv.extra["generation_error"] = str(gen_error)
        if not store.list_shards("generations"):
            followed.close()
            raise gen_error  # nothing to score or aggregate
        log.error("generation: %s; scoring and aggregating what was generated", gen_error)
    try:
        score_stats = scoring_and_aggregation(store, cfg, words, inv, use_ray, progress, followed)
    except Exception as exc:
        if gen_error is None:
            raise
        raise GenerationError(f"{gen_error}; then: {exc}", gen_stats) from exc
    if gen_error is not None:
        raise gen_error
    return {
        "jobs": the_plan.planned,
        "generation": gen_stats,
        "scoring": score_stats,
        "timings": inv.timings,
    }


def scoring_and_aggregation(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    inv: Invocation,
    use_ray: bool,
    progress: bool,
    followed: Followed | None = None,
) -> dict[str, Any]:
    """`run`'s last two stages, recorded in `inv`; returns the scoring stats. `followed`: the
    scorers that scored during generation (`harness.stages.score_follow`), taken over."""
    t0 = time.perf_counter()
    score_stats = score_stage(
        store, cfg, words, use_ray=use_ray, progress=progress, followed=followed
    )
    inv.stage("scoring", score_stats, time.perf_counter() - t0)
    t0 = time.perf_counter()
    aggregate_stage(store, use=first_scorer_per_metric(cfg))
    inv.stage("aggregate", {"summary": "summary.parquet"}, time.perf_counter() - t0)
    return score_stats

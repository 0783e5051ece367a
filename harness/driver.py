"""The orchestrator: plan → generate → score → aggregate. `run` calls the four stages in order;
`score` and `aggregate` call the last ones. Each stage's work is in `harness.stages` (its
rooms `generation` and `scoring`), its record goes to the run directory (`results.run`). The
driver never imports torch or transformers, and its memory does not grow with the number of
jobs: the plan is streamed, and expanded again as actors need batches.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from harness.config import RunConfig
from harness.stages.generation import (
    GenerationError,
    Plan,
    Setup,
    generate_stage,
    load_words,
    plan_stage,
    reassert_signal_handlers,
    reserve_generation,
)
from harness.stages.scoring import (
    Followed,
    follow_config,
    followers,
    following,
    score_stage,
    scorer_preference,
)
from jobs.words import GroupWords
from results.run.history import Invocation, update_manifest
from results.run.store import RunStore

__all__ = [
    # the pipeline and its stages, in order
    "run",
    "plan_stage",
    "generation_stage",
    "score_stage",
    "aggregate_stage",
    "load_words",  # the run's seed words, as `run` loads them
]

log = logging.getLogger("harness")


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
    # 1. plan
    t0 = time.perf_counter()
    words = load_words(cfg)
    the_plan = plan_stage(store, cfg, words, replan=replan, retry_failed=retry_failed)
    if the_plan.identity["kind"] == "replan":
        inv.extra["replan"] = the_plan.identity
    inv.stage("plan", the_plan.identity, time.perf_counter() - t0)
    # 2. generate (a generation error is raised at the end, after what was generated is scored)
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
    # 3. score, 4. aggregate
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


def generation_stage(
    store: RunStore,
    cfg: RunConfig,
    the_plan: Plan,
    words: GroupWords,
    use_ray: bool = True,
    progress: bool = True,
) -> tuple[dict[str, Any], GenerationError | None, Followed]:
    """Generate the plan's pending jobs, then compact the shards; returns (stats, error, the
    scorers that followed generation, for the final scoring pass).

    On Ray the replicas' GPUs are reserved first (`reserve_generation`), so a scorer that
    follows generation takes only what is left. A `GenerationError` is returned, not raised:
    what was generated is compacted, scored and aggregated all the same, and `run` raises it.
    """
    error: GenerationError | None = None
    setup: Setup | None = None
    stats: dict[str, Any] = {}
    if use_ray:
        reassert_signal_handlers()  # SIGTERM stays an interruption (`ray job stop`)
        if the_plan.pending:
            try:
                setup = reserve_generation(cfg, the_plan, followers(cfg))
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
                except GenerationError as exc:  # its stats hold the planned and pending counts
                    stats, error = dict(exc.stats), exc
        finally:
            if setup is not None:  # released by the stage; not if it never began
                setup.release()
        follow_result = follow.result
    store.compact_generations()  # one shard per batch → shards of ~50k rows
    update_manifest(store, {"generation": stats})
    return stats, error, follow_result


def aggregate_stage(store: RunStore, use: list[str] | None = None, **options: Any) -> Any:
    """Summary and reports; `use` names the scorer to read where several gave one metric;
    `options` (ppl_max, n_boot, seed) override the run config's `aggregation:`."""
    from results.report.build import aggregate_run
    from results.stats.join import scorer_choice
    from workers.tiny import report_tokenizer

    scorers = scorer_choice(use) if use else None
    return aggregate_run(store, scorers=scorers, tokenizer_for=report_tokenizer, **options)


def scoring_and_aggregation(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    inv: Invocation,
    use_ray: bool,
    progress: bool,
    followed: Followed | None = None,
) -> dict[str, Any]:
    """`run`'s last two stages, recorded in `inv`; returns the scoring stats."""
    t0 = time.perf_counter()
    score_stats = score_stage(
        store, cfg, words, use_ray=use_ray, progress=progress, followed=followed
    )
    inv.stage("scoring", score_stats, time.perf_counter() - t0)
    t0 = time.perf_counter()
    aggregate_stage(store, use=scorer_preference(cfg, [], store))
    inv.stage("aggregate", {"summary": "summary.parquet"}, time.perf_counter() - t0)
    return score_stats

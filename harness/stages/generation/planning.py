"""The plan stage: the config's prompts and grid, streamed into plan.parquet and counted in one
pass (`plan_pass`). The `Plan` holds the counts per slice and the done ids, never the jobs:
`Plan.batches(model)` expands that model's pending slices again and cuts batches lazily.
`plan` lists the jobs at once (tests, small tools)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from harness.config import (
    ConfigError,
    GenerationConfig,
    ModelConfig,
    RunConfig,
    check_grid_size,
    dump_config,
    redacted,
)
from harness.stages.generation.backends import MethodKey
from jobs.datasets import (
    Prompt,
    RtpFilter,
    load_paired_jsonl,
    load_prompt_list,
    load_realtoxicityprompts,
)
from jobs.grid import CHUNK_SIZE, PlanChunk, SliceKey, iter_plan
from jobs.queue import done_mask, iter_batches, pending_chunks
from jobs.spec import JobSpec, ModelRef, plan_columns
from jobs.words import GroupWords, load_group_words
from results.run.identity import PlanCheck, plan_fields
from results.run.store import RunStore
from results.schema import PLAN_SCHEMA

log = logging.getLogger("harness")

# (slices to expand, or None for all; jobs per chunk) → the grid's chunks in plan order
ChunkSource = Callable[[Callable[[SliceKey], bool] | None, int], Iterator[PlanChunk]]


@dataclasses.dataclass
class SliceCount:
    """Planned and pending (not done when the plan stage ran) jobs of one slice."""

    key: SliceKey
    planned: int = 0
    pending: int = 0


class Plan:
    """The run's plan after the plan stage: per-slice counts, the done ids it was checked
    against, and `source` to expand the grid again. Memory: the counts, not the jobs."""

    def __init__(
        self,
        source: ChunkSource,
        done: Any,
        counts: Sequence[SliceCount],
        identity: dict[str, Any] | None = None,
    ) -> None:
        self.source, self.done = source, done
        self.counts = list(counts)
        self.identity = identity or {}

    @property
    def planned(self) -> int:
        return sum(c.planned for c in self.counts)

    @property
    def pending(self) -> int:
        return sum(c.pending for c in self.counts)

    def models(self) -> list[ModelRef]:
        """Models with pending jobs, in plan order."""
        return list(dict.fromkeys(c.key.model for c in self.counts if c.pending))

    def pending_of(self, model: ModelRef) -> int:
        return sum(c.pending for c in self.counts if c.key.model == model)

    def method_keys(self, model: ModelRef) -> list[MethodKey]:
        """What the model's actors must prepare: the (method, params, task) of pending slices."""
        return sorted(
            {(c.key.method, c.key.params, c.key.task) for c in self.counts if _todo(c, model)}
        )

    def chunks(self, model: ModelRef, chunk_size: int = CHUNK_SIZE) -> Iterator[PlanChunk]:
        """The model's pending jobs, a chunk at a time (slices without pending jobs skipped)."""
        want = {c.key for c in self.counts if _todo(c, model)}
        return pending_chunks(self.source(want.__contains__, chunk_size), self.done)

    def batches(
        self, model: ModelRef, batch_size: int, chunk_size: int = CHUNK_SIZE
    ) -> Iterator[list[JobSpec]]:
        """The model's pending jobs as batches, cut lazily (`jobs.queue.iter_batches`)."""
        return iter_batches(self.chunks(model, chunk_size), batch_size)

    @classmethod
    def from_jobs(cls, jobs: Sequence[JobSpec], done: Any) -> Plan:
        """A plan over a list of jobs (small runs, tests): the same interface, jobs held."""
        slices: dict[SliceKey, list[JobSpec]] = {}
        for job in jobs:
            key = SliceKey(job.model, job.generation, job.method, job.method_params, job.task)
            slices.setdefault(key, []).append(job)

        def source(only: Callable[[SliceKey], bool] | None, chunk_size: int) -> Iterator[PlanChunk]:
            for key, mine in slices.items():
                if only is None or only(key):
                    for i in range(0, len(mine), chunk_size):
                        yield PlanChunk(key, mine[i : i + chunk_size])

        counts = [
            SliceCount(key, len(mine), len(mine) - sum(done_mask(mine, done)))
            for key, mine in slices.items()
        ]
        return cls(source, done, counts)


def _todo(count: SliceCount, model: ModelRef) -> bool:
    return count.pending > 0 and count.key.model == model


def plan_pass(
    store: RunStore, cfg: RunConfig, source: ChunkSource, done: Any, replan: bool = False
) -> Plan:
    """One pass over the grid: identity check, plan.parquet, per-slice counts.

    plan.parquet is streamed to a temporary file that replaces the old plan only at the end,
    once `PlanCheck.result` has accepted the new plan; a refused plan leaves the old file.

    Raises:
        results.run.identity.PlanChangedError: the plan changes or drops jobs and `replan` is false.
    """
    check = PlanCheck(store)
    counts: dict[SliceKey, SliceCount] = {}
    identity: dict[str, Any] = {}

    def tables() -> Iterator[pa.Table]:
        for chunk in source(None, CHUNK_SIZE):
            columns = plan_columns(chunk.jobs)
            ids = columns["job_id"]
            check.add(ids)
            count = counts.setdefault(chunk.slice, SliceCount(chunk.slice))
            count.planned += len(ids)
            count.pending += len(ids) - int(np.count_nonzero(done_mask(chunk.jobs, done)))
            yield pa.table(columns, schema=PLAN_SCHEMA)
        # raises inside the writer: nothing replaced
        identity.update(check.result(redacted(cfg), replan))

    store.makedirs()
    store.write_plan_tables(tables(), plan_fields(redacted(cfg)))
    return Plan(source, done, list(counts.values()), identity)


def load_words(cfg: RunConfig) -> GroupWords:
    return load_group_words(
        cfg.gender_words, sha256=cfg.gender_words_sha256, cache_dir=cfg.runtime.cache_dir
    )


def load_prompts(cfg: RunConfig, words: GroupWords) -> list[Prompt]:
    ds, cache = cfg.dataset, cfg.runtime.cache_dir
    sha = (ds.sha256 or {}).get("path")
    if ds.kind == "paired-jsonl":
        assert ds.files is not None
        return load_paired_jsonl(ds.files, limit=ds.limit, sha256=ds.sha256, cache_dir=cache)
    if ds.kind == "realtoxicityprompts":  # its filters, `limit` and sample seed
        bins = tuple((float(lo), float(hi)) for lo, hi in ds.toxicity_bins or [])
        keep = RtpFilter(ds.challenging, bins, ds.limit, ds.sample_seed)
        return load_realtoxicityprompts(ds.rtp_path(), keep, words, sha256=sha, cache_dir=cache)
    assert ds.path is not None
    return load_prompt_list(ds.path, ds.text_field, ds.limit, words, sha256=sha, cache_dir=cache)


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


def plan(cfg: RunConfig, words: GroupWords) -> list[JobSpec]:
    """Every job of the config's grid as one list (tests and small tools; `run` streams)."""
    prompts = load_prompts(cfg, words)
    check_grid_size(cfg, len(prompts))  # refuse before building a grid too large to hold
    return [job for chunk in chunk_source(cfg, prompts)(None, CHUNK_SIZE) for job in chunk.jobs]


def chunk_source(cfg: RunConfig, prompts: list[Prompt]) -> ChunkSource:
    """The grid of `cfg` over `prompts`, expandable again and again, slice by slice."""
    models = [(m.ref(), generation_for(cfg, m).params()) for m in cfg.models]
    methods = [(m.name, dict(m.params)) for m in cfg.methods]
    heads = {m.ref(): {str(t): h for t, h in m.heads.items()} for m in cfg.models}
    tasks, samples = list(cfg.tasks), cfg.samples_per_prompt
    return lambda only, chunk_size: iter_plan(
        prompts, models, methods, tasks, samples, chunk_size, heads, only
    )


def config_snapshot(store: RunStore, cfg: RunConfig) -> str:
    """config.yaml for `cfg` (secrets redacted), keeping the scorers the run's snapshot records
    and `cfg` lacks: those `score` added (`harness.stages.scoring.selection.record_scorers`); their
    scores stay in the run, so a re-run of the original config must not drop the record of how
    they were computed."""
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


def plan_stage(
    store: RunStore,
    cfg: RunConfig,
    words: GroupWords,
    replan: bool = False,
    retry_failed: bool = False,
) -> Plan:
    """Check the config's plan against the run's, write plan.parquet and config.yaml, and count
    planned and pending jobs: one streamed pass (`plan_pass`).

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

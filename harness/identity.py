"""Run identity: a run directory is bound to its plan.

`check_plan` compares the jobs a config asks for with `plan.parquet`. A config that only
adds jobs (a method, a model, more seeds or prompts) extends the plan: every job done stays
done. A config that changes or drops planned jobs is refused with the config fields that
differ; `--replan` replaces the plan instead, and rows of the old plan stay on disk but out
of every count (`plan_counts` reports them as foreign).
"""

from __future__ import annotations

from typing import Any

import polars as pl
import yaml

from harness.config import RunConfig, redacted
from jobs.spec import JobSpec
from results.store import RunStore, StoreError

# Sections that never change a job's output (see `jobs.spec.JobSpec.identity`).
NOT_PLAN = ("name", "runtime", "scorers")


class PlanChangedError(ValueError):
    """The config alters or removes jobs of the run directory's plan."""


def plan_ids(store: RunStore) -> set[str]:
    """Job ids of the current plan.

    Raises:
        StoreError: no plan.parquet. It is never rebuilt behind the user's back: `run` with
            the config rebuilds it.
    """
    if not store.exists("plan.parquet"):
        if not store.list_shards("generations"):
            raise StoreError(f"no generations in {store.uri}; run `python -m harness run` first")
        raise StoreError(
            f"{store.uri}: no plan.parquet, so nothing here can be counted as planned; "
            f"`python -m harness run CONFIG --out {store.uri}` writes it again from the config"
        )
    return set(store.read_plan()["job_id"].to_list())


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{"dataset.limit": 5, "models.0.id": ...}: dotted paths of a nested config."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): obj}


def changed_fields(store: RunStore, cfg: RunConfig) -> list[str]:
    """`field old → new` for every plan-relevant config field that differs from config.yaml."""
    try:
        old = yaml.safe_load(store.read_text("config.yaml"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return []
    if not isinstance(old, dict):
        return []
    new = redacted(cfg)
    a = {k: v for k, v in flatten(old).items() if not k.startswith(NOT_PLAN)}
    b = {k: v for k, v in flatten(new).items() if not k.startswith(NOT_PLAN)}
    return [
        f"{k} {a.get(k, '(unset)')} → {b.get(k, '(unset)')}"
        for k in sorted(a.keys() | b.keys())
        if a.get(k) != b.get(k)
    ]


def check_plan(
    store: RunStore, cfg: RunConfig, jobs: list[JobSpec], replan: bool = False
) -> dict[str, Any]:
    """How `jobs` relate to the run's plan: {"kind": "new" | "same" | "extend" | "replan", ...}.

    Raises:
        PlanChangedError: planned jobs would change or vanish and `replan` is false.
    """
    if not store.exists("plan.parquet"):
        return {"kind": "new", "jobs": len(jobs)}
    old = plan_ids(store)
    new = {j.job_id for j in jobs}
    gone = old - new
    if not gone:
        kind = "same" if new == old else "extend"
        return {"kind": kind, "jobs": len(new), "added": len(new - old)}
    fields = changed_fields(store, cfg)
    if replan:
        return {"kind": "replan", "jobs": len(new), "old_jobs": len(old), "changed": fields}
    what = "; ".join(fields) if fields else "no config field (the prompt files' contents?)"
    raise PlanChangedError(
        f"{store.uri} holds another plan: the config changes or drops {len(gone)} of its "
        f"{len(old)} planned jobs (changed: {what}). Only additions extend a run. Use a new "
        f"--out, or --replan to replace the plan here (the old rows stay on disk, outside "
        f"every count)"
    )


def plan_counts(store: RunStore) -> dict[str, Any]:
    """Rows on disk in and out of the current plan, for `status` and the manifest."""
    from workers.scorers.registry import SCORER_METRICS

    ids = plan_ids(store)
    gens = store.read_generations().select("job_id", "status")
    inside = gens.filter(pl.col("job_id").is_in(list(ids)))
    out: dict[str, Any] = {
        "planned": len(ids),
        "generations": inside.height,
        "generations_ok": inside.filter(pl.col("status") == "ok").height,
        "foreign_generations": gens.height - inside.height,
        "scores": {},
    }
    for name in store.scorers():
        if name not in SCORER_METRICS:
            continue
        rows = store.read_scores(name, SCORER_METRICS[name]).select("job_id")
        mine = rows.filter(pl.col("job_id").is_in(list(ids))).height
        out["scores"][name] = {"in_plan": mine, "foreign": rows.height - mine}
    return out

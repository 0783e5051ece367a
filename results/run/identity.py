"""Run identity (docs/design.md, "Identity"): a run directory is bound to its plan. A config
that only adds jobs extends the plan (`PlanCheck`, as the planner streams it); one that
changes or drops planned jobs is refused, or with `--replan` replaces the plan, the old rows
staying on disk outside every count (`plan_counts` reports them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import yaml

from results.run.store import DoneIds, RunStore, StoreError

# Sections that never change a job's output (see `jobs.spec.JobSpec.identity`).
NOT_PLAN = ("name", "runtime", "scorers", "aggregation")


class PlanChangedError(ValueError):
    """The config alters or removes jobs of the run directory's plan."""


def plan_ids(store: RunStore) -> set[str]:
    """Job ids of the current plan (a set: small plans; `plan_done_ids` holds them compactly).
    No plan.parquet is a `StoreError`: only `run` with the config writes it again."""
    require_plan(store)
    return set(store.read_plan(["job_id"])["job_id"].to_list())


def require_plan(store: RunStore) -> None:
    """Raises `StoreError` (naming the way out) when the run has no plan.parquet."""
    if not store.exists("plan.parquet"):
        if not store.list_shards("generations"):
            raise StoreError(f"no generations in {store.uri}; run `python -m harness run` first")
        raise StoreError(
            f"{store.uri}: no plan.parquet, so nothing here can be counted as planned; "
            f"`python -m harness run CONFIG --out {store.uri}` writes it again from the config"
        )


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{"dataset.limit": 5, "models.0.id": ...}: dotted paths of a nested config."""
    if not isinstance(obj, (dict, list)):
        return {prefix.rstrip("."): obj}
    out: dict[str, Any] = {}
    for k, v in obj.items() if isinstance(obj, dict) else enumerate(obj):
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def plan_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The dotted fields of a plain (redacted) config that shape its plan: all but NOT_PLAN."""
    return {k: v for k, v in flatten(config).items() if not k.startswith(NOT_PLAN)}


def _differ(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, in a, in b) of every field that differs, sorted; an absent one is `(unset)`."""
    keys = sorted(a.keys() | b.keys())
    return [(k, a.get(k, "(unset)"), b.get(k, "(unset)")) for k in keys if a.get(k) != b.get(k)]


def read_config(store: RunStore) -> dict[str, Any] | None:
    """RUN/config.yaml as plain data (None: the run has none), checked against the fields its
    plan recorded when it was written (`plan_fields`).

    Raises:
        StoreError: config.yaml is not YAML, or not a mapping, or a field that shapes the plan
            differs from the plan's record (an edit); the message names the file and the line
            or the field, and the command that plans again.
    """
    if not store.exists("config.yaml"):
        return None
    where = store.path("config.yaml")
    again = f"`python -m harness run CONFIG --out {store.uri}` writes it again from your config"
    try:
        raw = yaml.safe_load(store.read_text("config.yaml"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        why = getattr(exc, "problem", None) or exc
        raise StoreError(f"{where}:{line} not valid YAML ({why}); {again}") from None
    if not isinstance(raw, dict):
        raise StoreError(f"{where}: not a config (a mapping of sections); {again}")
    recorded = store.plan_fields() if store.exists("plan.parquet") else None
    if recorded is not None:
        edits = [
            f"{k} is {a!r}, planned with {b!r}" for k, a, b in _differ(plan_fields(raw), recorded)
        ]
        if edits:
            raise StoreError(
                f"{where} was edited after its plan was made ({'; '.join(edits)}): put it "
                f"back, or plan the run from it: `python -m harness run {where} --out "
                f"{store.uri}` (with --replan if it changes planned jobs)"
            )
    return raw


def changed_fields(store: RunStore, config: dict[str, Any]) -> list[str]:
    """`field old → new` for every plan-relevant config field that differs from config.yaml.

    `config`: the new config as a plain dict with its secrets redacted, as config.yaml holds
    it (`harness.config.redacted`)."""
    try:
        old = yaml.safe_load(store.read_text("config.yaml"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return []
    if not isinstance(old, dict):
        return []
    return [f"{k} {a} → {b}" for k, a, b in _differ(plan_fields(old), plan_fields(config))]


class PlanCheck:
    """How a new plan relates to the run's: feed each planned chunk's job ids to `add`, then
    call `result`. The new plan is counted, never held: its ids are unique (the planner refuses
    duplicates), so old − new is empty exactly when every old id was seen."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.old: DoneIds | None = plan_done_ids(store) if store.exists("plan.parquet") else None
        self.jobs = 0  # new plan
        self.kept = 0  # new jobs that the old plan holds

    def add(self, job_ids: Sequence[str] | Any) -> None:
        self.jobs += len(job_ids)
        if self.old is not None:
            self.kept += int(np.count_nonzero(self.old.contains(job_ids)))

    def result(self, config: dict[str, Any], replan: bool = False) -> dict[str, Any]:
        """{"kind": "new" | "same" | "extend" | "replan", ...}; `config`: the new config as
        `changed_fields` takes it (a redacted plain dict).

        Raises:
            PlanChangedError: planned jobs would change or vanish and `replan` is false.
        """
        if self.old is None:
            return {"kind": "new", "jobs": self.jobs}
        old = len(self.old)
        gone = old - self.kept
        if not gone:
            kind = "same" if self.jobs == old else "extend"
            return {"kind": kind, "jobs": self.jobs, "added": self.jobs - self.kept}
        fields = changed_fields(self.store, config)
        if replan:
            return {"kind": "replan", "jobs": self.jobs, "old_jobs": old, "changed": fields}
        what = "; ".join(fields) if fields else "no config field (the prompt files' contents?)"
        raise PlanChangedError(
            f"{self.store.uri} holds another plan: the config changes or drops {gone} of its "
            f"{old} planned jobs (changed: {what}). Only additions extend a run. Use a new "
            f"--out, or --replan to replace the plan here (the old rows stay on disk, outside "
            f"every count)"
        )


def plan_done_ids(store: RunStore) -> DoneIds:
    """Job ids of the current plan as a compact `DoneIds`, read a row group at a time."""
    require_plan(store)
    return DoneIds.from_arrays(
        [t.column("job_id").combine_chunks() for t in store.iter_plan(columns=["job_id"])]
    )


def plan_counts(store: RunStore) -> dict[str, Any]:
    """Rows on disk in and out of the current plan (the manifest's `counts`), streamed: the
    plan's and the finished ids as `DoneIds`, scores one column at a time."""
    import pyarrow as pa

    from jobs.catalog import SCORER_METRICS

    ids = plan_done_ids(store)
    ok, failed = store.finished_ids()  # one row per job: ok wins over error
    ok_in = int(np.count_nonzero(ids.contains_bytes(ok.ids)))
    failed_in = int(np.count_nonzero(ids.contains_bytes(failed.ids)))
    out: dict[str, Any] = {
        "planned": len(ids),
        "generations": ok_in + failed_in,
        "generations_ok": ok_in,
        "foreign_generations": len(ok) + len(failed) - ok_in - failed_in,
        "scores": {},
    }
    for name in store.scorers():
        if name not in SCORER_METRICS:
            continue
        rows = store.read_scores(name, SCORER_METRICS[name], columns=["job_id"])["job_id"]
        column = rows.to_arrow().cast(pa.string())
        mine = int(np.count_nonzero(ids.contains(column)))
        out["scores"][name] = {"in_plan": mine, "foreign": len(rows) - mine}
    return out

"""`status RUN`: planned / done / failed per stage, as a small text table.

Only jobs of the current plan are counted; rows on disk outside it (an old plan replaced with
`--replan`, or written by hand) are reported on their own line, never summed.
"""

from __future__ import annotations

import argparse
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from jobs.redact import printable
from results.report.pieces import model_label, model_names
from results.run.done import DoneIds
from results.run.history import read_manifest
from results.run.identity import plan_done_ids, read_config
from results.run.store import RunStore, StoreError
from results.stats.join import JoinError, scorer_metric
from workers.plugins import load_plugins


def status_main(args: argparse.Namespace) -> int:
    """The `status` subcommand (exit 0, or 2 through StoreError: not a run directory)."""
    store = RunStore(args.run)
    if not store.exists("plan.parquet") and not store.exists("config.yaml"):
        raise StoreError(f"{args.run}: not a run directory (no plan.parquet, no config.yaml)")
    return print_status(store)


def print_status(store: RunStore) -> int:
    print(printable(run_status(store)))  # model ids, paths: a terminal's controls escaped
    return 0


def failed_methods(store: RunStore) -> list[str]:
    """One line per method whose every planned job failed (`run` then exits 1)."""
    table = (
        store.generation_counts()
        .group_by("method", maintain_order=True)
        .agg(pl.col("planned", "failed").sum())
    )
    return [
        f"method {method}: all {failed} of its jobs failed; their errors: `python -m harness "
        f"samples {store.uri} --status error --method {method}`"
        for method, planned, failed in table.iter_rows()
        if failed and failed == planned
    ]


def _config_lines(store: RunStore) -> tuple[list[str], dict[str, str]]:
    """(What `aggregate` and `score` would refuse in RUN/config.yaml (an edit of a planned
    field, a file that is not YAML), checked as they check it (`read_config`); the models'
    names, as the tables print them)."""
    try:
        return [], model_names(read_config(store))
    except StoreError as exc:
        return [f"  config: {exc}"], {}


def run_status(store: RunStore) -> str:
    """The status text. Memory: sorted id arrays (~23 bytes a job) for the plan and the
    finished jobs, and one scorer's job ids and statuses at a time; never the plan's rows."""
    finished = store.finished_ids()  # one streamed scan of job_id/status
    table = store.generation_counts(finished)  # streams the plan
    plan = plan_done_ids(store)
    ok, failed = finished
    problems, names = _config_lines(store)
    lines = [f"run {store.uri}", *problems, "generation:"]
    for row in table.iter_rows(named=True):
        cell = f"{model_label(row['model'], names)} / {row['method']} / {row['task']}"
        lines.append(
            f"  {cell}: planned {row['planned']}, done {row['done']}, failed {row['failed']}, "
            f"pending {row['pending']}"
        )
    for path in store.quarantine_files():
        lines.append(f"  quarantined (unreadable, its jobs pending): {path}")
    manifest = read_manifest(store)  # a damaged one is rebuilt here
    foreign = len(ok.minus(plan)) + len(failed.minus(plan))
    if foreign:
        replans = manifest.get("replans") or []
        when = f" (plan replaced with --replan at {replans[-1]['at']})" if replans else ""
        lines.append(
            f"  {foreign} generation row(s) on disk are outside the current plan{when}: "
            "kept, not counted"
        )
    lines.extend(_actor_lines(manifest, names))
    ok_in_plan = DoneIds(ok.ids[plan.contains_bytes(ok.ids)]) if len(plan) else DoneIds(ok.ids[:0])
    del finished, ok, failed
    scorers = store.scorers()
    lines.append("scoring:" if scorers else "scoring: nothing scored yet")
    newest_score = 0.0
    load_plugins()  # entry-point scorers; --include ones are registered by the CLI
    for name in scorers:
        try:  # a scorer not registered here (a plugin not loaded): its shards' metric column
            metric = scorer_metric(store, name)
        except (JoinError, OSError, KeyError, pa.ArrowException):
            metric = None
        if metric is None:
            lines.append(f"  {name}: no readable score rows")
            continue
        newest_score = max([newest_score, *store.shard_mtimes("scores", name)])
        scores = store.read_scores(name, metric, columns=["job_id", "status"])
        ids = scores["job_id"].to_arrow().cast(pa.string())
        wanted = pl.Series(ok_in_plan.contains(ids))
        scored = scores.filter(wanted)
        counts = dict(scored.group_by("status").len().iter_rows())
        missing = len(ok_in_plan) - len(DoneIds.from_arrow(ids.filter(pa.array(wanted.to_numpy()))))
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        outside = int((~plan.contains(ids)).sum())
        tail = f"; {outside} row(s) outside the plan, not counted" if outside else ""
        lines.append(f"  {name}: {detail or 'none'}; missing {missing}{tail}")
    lines.append(f"summary.parquet: {_summary_state(store, newest_score)}")
    lines.extend(output_lines(store))
    return "\n".join(lines)


def output_lines(store: RunStore) -> list[str]:
    """Where the outputs to open are: the HTML report, the tables, the figures, results.json
    (written ones by path, the others 'not yet')."""
    from results.report.results_json import RESULTS_JSON

    lines = []
    for rel, what in (
        ("report/index.html", "report"),
        ("report/tables.md", "tables"),
        ("report/report.tex", "LaTeX report"),
        ("summary.csv", "summary table"),
        (RESULTS_JSON, "results"),
    ):
        where = store.path(rel) if store.exists(rel) else "not yet"
        lines.append(f"{what} ({rel}): {where}")
    figures = sorted(_listed(store, "report", "png"))
    also = [ext for ext in ("pdf", "svg") if _listed(store, "report", ext)]
    beside = f" (and .{', .'.join(also)} beside each)" if figures and also else ""
    lines.append(f"figures: {', '.join(figures) if figures else 'none yet'}{beside}")
    return lines


def _listed(store: RunStore, folder: str, ext: str) -> list[str]:
    files = store.entries(folder, recursive=True)
    return [i.path for i in files if i.type == pafs.FileType.File and i.path.endswith("." + ext)]


def _summary_state(store: RunStore, newest_score: float) -> str:
    if not store.exists("summary.parquet"):
        return "not yet"
    mtime = store.fs.get_file_info(store.path("summary.parquet")).mtime
    newest = max([newest_score, *store.shard_mtimes("generations")])
    if mtime is not None and mtime.timestamp() < newest:
        return "STALE (older than the newest scores; run `python -m harness aggregate`)"
    return "written (up to date with the scores)"


def _actor_lines(manifest: dict[str, Any], names: dict[str, str]) -> list[str]:
    """`status` lines: per model, the actors of the last generation run and their throughput."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for actor in (manifest.get("generation") or {}).get("actors") or []:
        by_model.setdefault(actor["model"], []).append(actor)
    lines = []
    for model, mine in by_model.items():
        died = sum(1 for a in mine if str(a.get("end", "")).startswith("died"))
        busy = [a["utilisation"] for a in mine if a.get("utilisation") is not None]
        util = f"{sum(busy) / len(busy):.0%}" if busy else "-"
        jobs = sum(a.get("jobs", 0) for a in mine)
        lines.append(
            f"  {model_label(model, names)}: last run {len(mine)} actor(s) ({died} died), "
            f"{jobs} jobs, mean utilisation {util} (manifest.json has each actor)"
        )
    return lines

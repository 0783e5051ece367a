"""`status`: planned / done / failed per stage, as a small text table.

Only jobs of the current plan are counted; rows on disk outside it (an old plan replaced with
`--replan`, or written by hand) are reported on their own line, never summed.
"""

from __future__ import annotations

import polars as pl

from harness.manifest import read_manifest
from results.store import RunStore
from workers.scorers.registry import SCORER_METRICS


def run_status(store: RunStore) -> str:
    table = store.generation_counts()  # streams the plan; one scan of job_id/status
    planned_ids = store.read_plan(["job_id"])["job_id"]
    all_gens = store.read_generations(columns=["job_id", "status"])
    gens = all_gens.filter(pl.col("job_id").is_in(planned_ids.implode()))
    lines = [f"run {store.uri}", "generation:"]
    for row in table.iter_rows(named=True):
        lines.append(
            f"  {row['model']} / {row['method']} / {row['task']}: planned {row['planned']}, "
            f"done {row['done']}, failed {row['failed']}, pending {row['pending']}"
        )
    for path in store.quarantine_files():
        lines.append(f"  quarantined (unreadable, its jobs pending): {path}")
    manifest = read_manifest(store)  # a damaged one is rebuilt here
    foreign = all_gens.height - gens.height
    if foreign:
        replans = manifest.get("replans") or []
        when = f" (plan replaced with --replan at {replans[-1]['at']})" if replans else ""
        lines.append(
            f"  {foreign} generation row(s) on disk are outside the current plan{when}: "
            "kept, not counted"
        )
    if manifest:  # actors and throughput of the last generation run
        from harness.generation import actor_lines

        lines.extend(actor_lines(manifest))
    ok_ids = gens.filter(pl.col("status") == "ok")["job_id"]
    scorers = store.scorers()
    lines.append("scoring:" if scorers else "scoring: nothing scored yet")
    newest_score = 0.0
    for name in scorers:
        metric = SCORER_METRICS.get(name)
        if metric is None:
            lines.append(f"  {name}: unknown scorer (written by another version?)")
            continue
        newest_score = max([newest_score, *_mtimes(store, "scores", name)])
        scores = store.read_scores(name, metric, columns=["job_id", "status"])
        scored = scores.filter(pl.col("job_id").is_in(ok_ids.implode()))
        counts = dict(scored.group_by("status").len().iter_rows())
        missing = int((~ok_ids.is_in(scored["job_id"].implode())).sum())
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        outside = scores.filter(~pl.col("job_id").is_in(planned_ids.implode())).height
        tail = f"; {outside} row(s) outside the plan, not counted" if outside else ""
        lines.append(f"  {name}: {detail or 'none'}; missing {missing}{tail}")
    lines.append(f"summary.parquet: {_summary_state(store, newest_score)}")
    lines.append(
        f"report/tables.md: {'written' if store.exists('report/tables.md') else 'not yet'}"
    )
    return "\n".join(lines)


def _mtimes(store: RunStore, *parts: str) -> list[float]:
    out = []
    for path in store.list_shards(*parts):
        mtime = store.fs.get_file_info(path).mtime
        if mtime is not None:
            out.append(mtime.timestamp())
    return out


def _summary_state(store: RunStore, newest_score: float) -> str:
    if not store.exists("summary.parquet"):
        return "not yet"
    mtime = store.fs.get_file_info(store.path("summary.parquet")).mtime
    newest = max([newest_score, *_mtimes(store, "generations")])
    if mtime is not None and mtime.timestamp() < newest:
        return "STALE (older than the newest scores; run `python -m harness aggregate`)"
    return "written (up to date with the scores)"

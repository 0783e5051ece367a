"""`status`: planned / done / failed per stage, as a small text table."""

from __future__ import annotations

import polars as pl

from results.store import RunStore
from workers.scorers.registry import SCORER_METRICS


def run_status(store: RunStore) -> str:
    table = store.generation_counts()  # streams the plan; one scan of job_id/status
    lines = [f"run {store.uri}", "generation:"]
    for row in table.iter_rows(named=True):
        lines.append(
            f"  {row['model']} / {row['method']} / {row['task']}: planned {row['planned']}, "
            f"done {row['done']}, failed {row['failed']}, pending {row['pending']}"
        )
    for path in store.quarantine_files():
        lines.append(f"  quarantined (unreadable, its jobs pending): {path}")
    if store.exists("manifest.json"):  # actors and throughput of the last generation run
        from harness.generation import actor_lines

        lines.extend(actor_lines(store.read_json("manifest.json")))
    scorers = store.scorers()
    gens = store.read_generations(columns=["job_id", "status"]) if scorers else None
    ok_ids = gens.filter(pl.col("status") == "ok")["job_id"] if gens is not None else pl.Series()
    lines.append("scoring:" if scorers else "scoring: nothing scored yet")
    for name in scorers:
        metric = SCORER_METRICS.get(name)
        if metric is None:
            lines.append(f"  {name}: unknown scorer (written by another version?)")
            continue
        scores = store.read_scores(name, metric, columns=["job_id", "status"])
        scored = scores.filter(pl.col("job_id").is_in(ok_ids.implode()))
        counts = dict(scored.group_by("status").len().iter_rows())
        missing = int((~ok_ids.is_in(scored["job_id"].implode())).sum())
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        lines.append(f"  {name}: {detail or 'none'}; missing {missing}")
    for extra in ("summary.parquet", "report/tables.md"):
        lines.append(f"{extra}: {'written' if store.exists(extra) else 'not yet'}")
    return "\n".join(lines)

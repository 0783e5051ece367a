"""`RunStore`: the run directory's Parquet shards, plan and files (layout: docs/design.md).

A shard is complete or absent (`results.run.shards`); shard names hash the job ids they hold,
so a retried batch rewrites the same file, and the driver's error shards carry `-failed`, so a
zombie actor's late write of the same batch never collides with them. Reads deduplicate by job
id, so a row in two shards (a compaction killed half-way) counts once.
"""

from __future__ import annotations

from results.run.compaction import Compaction
from results.run.done import DoneIds
from results.run.files import shard_name
from results.run.generations import GenerationShards
from results.run.scores import ScoreShards
from results.run.shards import StoreError

__all__ = ["DoneIds", "RunStore", "StoreError", "shard_name"]


class RunStore(GenerationShards, ScoreShards, Compaction):
    """A run directory on the local disk or on a pyarrow filesystem (URI), by concern: files
    and atomic writes (`files`), the plan (`plan_file`), generation shards and finished ids
    (`generations`), score shards (`scores`), their compaction (`compaction`), over shard
    scans with retries (`reader`) and the quarantine of damaged shards (`quarantine`)."""

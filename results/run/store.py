"""The run directory: atomic Parquet shards, the plan, the manifest.

Layout (see docs/design.md)::

    RUN/config.yaml  manifest.json  plan.parquet
    RUN/generations/part-<hash>.parquet          one finished batch (written by its actor)
    RUN/generations/part-<hash>-failed.parquet   error rows the driver wrote for a failed batch
    RUN/generations/part-c-<hash>.parquet        compacted: many batches, sorted by slice
    RUN/scores/<scorer>/part-<hash>.parquet
    RUN/quarantine/<stage>/...                   unreadable shards, moved aside (jobs pending)
    RUN/summary.parquet  summary.csv  report/

A shard is complete or absent: local files go to a temp file in the same folder, are fsynced and
renamed (`os.replace`); object stores (s3://, gs://) get one put of bytes built in memory, and a
streamed object (the plan) goes to a temp key that is copied into place only once it is whole.
Shard names hash the job ids they hold, so a retried batch rewrites the same file; the driver's
error shards carry `-failed`, so a late write of the batch by a zombie actor never collides with
them. Reads go through `pyarrow.dataset` (parallel, only the columns asked for) and deduplicate by
job id, so a row present in two shards (a compaction killed half-way) counts once.
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
    """A run directory on the local disk or on a pyarrow filesystem (URI).

    Its parts, by concern: paths, listings and atomic writes (`results.run.files.RunFiles`),
    the plan (`results.run.plan_file`), generation shards and finished ids
    (`results.run.generations`), score shards (`results.run.scores`), the compaction of both
    (`results.run.compaction`); shard scans and their retries (`results.run.reader`) and the
    quarantine of damaged shards (`results.run.quarantine`) sit below them.
    """

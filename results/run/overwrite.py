"""`score --overwrite`: score every ok row again and replace a scorer's scores, losing nothing
on failure.

The new scores are written to RUN/overwrite/<scorer>/ (a `RunStore` whose score reads and
writes for those scorers go there; it starts empty, so every row is scored again, at any
version). Only when every scorer finished without a failed chunk is each scores/<scorer>/
replaced: the old folder is moved to RUN/overwrite/<scorer>.old, the new one moved in, the
old one deleted. A failure or an interrupt before that leaves scores/ as it was (the partial
new scores stay in RUN/overwrite/ until the next `--overwrite`, which starts it afresh).

The two moves are renames on a local or shared filesystem; on an object store (s3://, gs://)
a folder move is a copy of each shard, so a crash between the two moves is possible there:
the old scores are then in RUN/overwrite/<scorer>.old.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from results.run.store import RunStore, shard_name
from results.schema import score_schema

log = logging.getLogger("harness")

STAGING = "overwrite"


class StagedScores(RunStore):
    """A `RunStore` whose scores of `names` live in RUN/overwrite/<name>/."""

    def __init__(self, root: str, names: Sequence[str]) -> None:
        super().__init__(root)
        self.staged = set(names)

    def write_scores(self, scorer: str, metric: str, rows: Sequence[dict[str, Any]]) -> str:
        if scorer not in self.staged:
            return super().write_scores(scorer, metric, rows)
        table = pa.Table.from_pylist(list(rows), score_schema(metric))
        keys = (f"{r['job_id']}\x00{r['scorer_version']}" for r in rows)
        return self.write_table(f"{STAGING}/{scorer}/" + shard_name(keys), table)

    def read_scores(
        self, scorer: str, metric: str, columns: list[str] | None = None
    ) -> pl.DataFrame:
        if scorer not in self.staged:
            return super().read_scores(scorer, metric, columns)
        want = list(columns or score_schema(metric).names)
        cols = want + [c for c in ("job_id", "scorer_version") if c not in want]
        frame = pl.from_arrow(self.reader.scan((STAGING, scorer), score_schema(metric), cols))
        assert isinstance(frame, pl.DataFrame)
        if frame.is_empty():
            return frame.select(want)
        return frame.unique(["job_id", "scorer_version"], keep="last", maintain_order=True).select(
            want
        )


def _delete_dir(store: RunStore, rel: str) -> None:
    info = store.fs.get_file_info(store.path(rel))
    if info.type == pafs.FileType.Directory:
        store.fs.delete_dir(store.path(rel))


def score_overwriting(
    store: RunStore, names: Sequence[str], score: Callable[[RunStore], dict[str, Any]]
) -> dict[str, Any]:
    """`score` (the scoring stage) every ok row of `names` into the staging folder, then swap
    it in."""
    for name in names:
        _delete_dir(store, f"{STAGING}/{name}")  # a partial earlier attempt
        _delete_dir(store, f"{STAGING}/{name}.old")
    staged = StagedScores(store.uri, names)
    stats = score(staged)  # raises on failure
    for name in names:
        new = f"{STAGING}/{name}"
        if not staged.exists(new):  # nothing scored (no ok rows): the old scores stay
            continue
        old, aside = f"scores/{name}", f"{STAGING}/{name}.old"
        had_old = store.fs.get_file_info(store.path(old)).type == pafs.FileType.Directory
        if had_old:
            store.fs.move(store.path(old), store.path(aside))
        store.makedirs("scores")
        store.fs.move(store.path(new), store.path(old))
        if had_old:
            store.fs.delete_dir(store.path(aside))
        log.info("%s: scores replaced (%s)", name, store.path(old))
    _delete_dir(store, STAGING)
    return stats

"""A scorer's persistent cache (Perspective's) kept in the run's storage (RUN/cache/), not in
a worker's ~/.cache: `scorer_context` gives the scorer a cache directory backed by the run
(`CacheMirror`), unless the context or the scorer's parameters name a shared place.

Used where the scorer runs: a `workers.actors.ScorerActor`, or the driver without Ray.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from typing import Any

import pyarrow as pa

from results.run.store import RunStore, shard_name
from results.schema import CACHE_ANSWER_SCHEMA
from workers.scorers.base import ScorerContext
from workers.scorers.score_cache import COLUMNS, ScoreCache

CACHE_REL = "cache"  # RUN/cache/<file>, and RUN/cache/<file stem>/ for the answer shards
SYNCED_CACHES = {"perspective": "perspective-scores.sqlite"}  # scorer → its cache file
SHARD_ROWS = 8192  # new answers per shard put back (or whatever is new every `every_s`)


class CacheMirror:
    """Gives a scorer a cache directory that lives with the run: the sqlite file itself in a
    local run directory (RUN/cache/); on an object store a working copy in a temp folder, loaded
    from the run's answer shards and put back as shards (`maybe_put`), so a lost node loses at
    most `every_s` of answers (docs/design.md, "Scoring").
    """

    def __init__(
        self, run_uri: str, file_name: str, every_s: float = 60.0, shard_rows: int = SHARD_ROWS
    ) -> None:
        self.store = RunStore(run_uri)
        self.every_s, self.shard_rows = every_s, max(1, shard_rows)
        self.parts = (CACHE_REL, file_name.rsplit(".", 1)[0])
        self.last_put = time.monotonic()
        self.stats = {"loaded": 0, "put_answers": 0, "put_shards": 0}
        self.copy: ScoreCache | None = None  # the working copy (object stores), in a temp dir
        if self.store.local:
            self.dir = self.store.path(CACHE_REL)
            os.makedirs(self.dir, exist_ok=True)
            if self.store.list_shards(*self.parts):  # answers an object-store run put back
                self._load(ScoreCache(os.path.join(self.dir, file_name)), close=True)
            return
        self.dir = tempfile.mkdtemp(prefix="lidao-cache-")
        legacy = f"{CACHE_REL}/{file_name}"  # the whole file, as versions before shards put it
        if self.store.exists(legacy):
            with (
                self.store.fs.open_input_stream(self.store.path(legacy)) as src,
                open(os.path.join(self.dir, file_name), "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        self.copy = ScoreCache(os.path.join(self.dir, file_name))
        self._load(self.copy)
        self.mark = self.copy.last_rowid()  # what is held now is in the run's storage

    def _load(self, cache: ScoreCache, close: bool = False) -> None:
        """Add the answer shards' rows to `cache`: a shard at a time, a record batch at a time
        (no read-ahead: memory of one row group, whatever the number of shards)."""
        for path in self.store.list_shards(*self.parts):
            shard = self.store.reader.dataset([path], CACHE_ANSWER_SCHEMA)
            for batch in shard.to_batches(
                columns=list(COLUMNS), batch_size=4096, batch_readahead=0, fragment_readahead=0
            ):
                rows = zip(*(batch.column(c).to_pylist() for c in COLUMNS), strict=True)
                self.stats["loaded"] += cache.add_rows(rows)
        if close:
            cache.close()

    @property
    def uri(self) -> str:
        return f"{self.store.uri.split('?')[0].rstrip('/')}/{'/'.join(self.parts)}"

    def maybe_put(self, force: bool = False) -> None:
        """Put the answers added since the last put back (object stores only): each
        `shard_rows` of them at once, and what is left once `every_s` has passed or when
        `force`. A shard of half `shard_rows` or more is final (`part-c-`, 100 answers a second
        fill one in 41 s); a smaller `part-` shard is compacted by `close`."""
        if self.copy is None:
            return
        due = force or time.monotonic() - self.last_put >= self.every_s
        while due or self.copy.count_after(self.mark) >= self.shard_rows:
            rows, mark = self.copy.rows_after(self.mark, self.shard_rows)
            if not rows:
                break
            table = pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], CACHE_ANSWER_SCHEMA)
            name = shard_name("\x00".join(r[:4]) for r in rows)
            if 2 * len(rows) >= self.shard_rows:  # big enough to stay as it is
                name = "part-c-" + name[len("part-") :]
            self.store.write_table("/".join([*self.parts, name]), table)
            self.mark = mark
            self.stats["put_answers"] += len(rows)
            self.stats["put_shards"] += 1
        if due:
            self.last_put = time.monotonic()

    def close(self) -> dict[str, Any]:
        """Put back what is new, compact the shards, remove the working copy; returns stats."""
        if self.copy is not None:
            self.maybe_put(force=True)
            self.copy.close()
            self.stats["compacted"] = self.store.compact_answers(self.parts)
            shutil.rmtree(self.dir, ignore_errors=True)
        return dict(self.stats)


def scorer_context(
    name: str, params: dict[str, Any], context: ScorerContext, run_uri: str
) -> tuple[ScorerContext, CacheMirror | None]:
    """The context a scorer gets: its persistent cache in the run's storage unless
    `cache_dir` (or the scorer's own `cache_file`) names a shared place."""
    if name not in SYNCED_CACHES or context.cache_dir or params.get("cache_file"):
        return context, None
    mirror = CacheMirror(run_uri, SYNCED_CACHES[name])
    return dataclasses.replace(context, cache_dir=mirror.dir), mirror

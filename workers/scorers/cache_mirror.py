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
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from results.run.store import RunStore, shard_name
from results.schema import CACHE_ANSWER_SCHEMA
from workers.scorers.base import ScorerContext
from workers.scorers.score_cache import COLUMNS, CachedScore, CacheKey, ScoreCache

CACHE_REL = "cache"  # RUN/cache/<file>, and RUN/cache/<file stem>/ for the answer shards
SYNCED_CACHES = {"perspective": "perspective-scores.sqlite"}  # scorer → its cache file
SHARD_ROWS = 8192  # new answers per shard put back (or whatever is new every `every_s`)


class CacheMirror:
    """Gives a scorer a cache directory that lives with the run: the sqlite file itself in a
    local run directory (RUN/cache/); on an object store a working copy in a temp folder for
    the new answers, put back as shards (`maybe_put`), so a lost node loses at most `every_s`
    of answers, and the run's shards read when a key is looked up (`fill`), not at start: the
    start reads only the shards' key column (`ShardIndex`). docs/design.md, "Scoring".
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
                cache = ScoreCache(os.path.join(self.dir, file_name))
                for path in self.store.list_shards(*self.parts):
                    self._load(cache, path)
                cache.close()
            return
        remove_stale(tempfile.gettempdir())
        self.dir = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
        legacy = f"{CACHE_REL}/{file_name}"  # the whole file, as versions before shards put it
        if self.store.exists(legacy):
            with (
                self.store.fs.open_input_stream(self.store.path(legacy)) as src,
                open(os.path.join(self.dir, file_name), "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        self.copy = ScoreCache(os.path.join(self.dir, file_name))
        self.mark = self.copy.last_rowid()  # what is held now is in the run's storage
        self.shards = self.store.list_shards(*self.parts)
        self.index = ShardIndex(self.store, self.shards)
        self.read: set[int] = set()  # shards copied into `from_shards`
        self.from_shards = ScoreCache(os.path.join(self.dir, "from-shards.sqlite"))

    def _load(self, cache: ScoreCache, path: str) -> None:
        """Add one answer shard's rows to `cache`, a record batch at a time (no read-ahead:
        memory of one row group, whatever the shard's size)."""
        shard = self.store.reader.dataset([path], CACHE_ANSWER_SCHEMA)
        for batch in shard.to_batches(
            columns=list(COLUMNS), batch_size=4096, batch_readahead=0, fragment_readahead=0
        ):
            rows = zip(*(batch.column(c).to_pylist() for c in COLUMNS), strict=True)
            self.stats["loaded"] += cache.add_rows(rows)

    def fill(self, keys: Sequence[CacheKey]) -> dict[CacheKey, CachedScore]:
        """The run's stored answers to `keys` (those the working copy lacks): the shards that
        may hold them are copied into a second sqlite file on first use, each shard once."""
        if not self.shards:
            return {}
        for shard in sorted(self.index.shards_of([k.text_sha256 for k in keys]) - self.read):
            self._load(self.from_shards, self.shards[shard])
            self.read.add(shard)
        return self.from_shards.get_many(keys)

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
            self.from_shards.close()
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
    fill = mirror.fill if mirror.copy is not None else None
    return dataclasses.replace(context, cache_dir=mirror.dir, cache_fill=fill), mirror


class ShardIndex:
    """Which answer shards may hold a text: the first 8 bytes of every stored `text_sha256`,
    sorted, beside their shard's number (12 bytes an answer: 12 MB at 1M). Built from the
    shards' key column only, a record batch at a time."""

    def __init__(self, store: RunStore, shards: Sequence[str]) -> None:
        prefixes, numbers = [], []
        for number, path in enumerate(shards):
            shard = store.reader.dataset([path], CACHE_ANSWER_SCHEMA)
            for batch in shard.to_batches(
                columns=["text_sha256"], batch_size=65536, batch_readahead=0, fragment_readahead=0
            ):
                found = prefix_numbers(batch.column(0).to_pylist())
                prefixes.append(found)
                numbers.append(np.full(len(found), number, dtype=np.uint32))
        keys = np.concatenate(prefixes) if prefixes else np.zeros(0, dtype=np.uint64)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.shard = np.concatenate(numbers)[order] if numbers else np.zeros(0, dtype=np.uint32)

    def shards_of(self, digests: Sequence[str]) -> set[int]:
        """The shards whose answers share a digest's first 8 bytes (those holding it, and very
        rarely another)."""
        if not digests or not len(self.keys):
            return set()
        wanted = prefix_numbers(digests)
        lo = np.searchsorted(self.keys, wanted, side="left")
        hi = np.searchsorted(self.keys, wanted, side="right")
        return {int(n) for a, b in zip(lo, hi, strict=True) for n in self.shard[a:b]}


def prefix_numbers(digests: Sequence[str]) -> Any:
    """Hex SHA-256 digests' first 8 bytes as unsigned integers (a numpy array)."""
    raw = bytes.fromhex("".join(d[:16] for d in digests))
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


TEMP_PREFIX = "lidao-cache-"  # + the pid of the process whose working copy it is


def remove_stale(root: str) -> list[str]:
    """Remove the working copies under `root` whose process is gone (a SIGKILLed actor never
    removes its own: ~481 B an answer); returns them. Another live process's are kept."""
    gone = []
    for entry in os.scandir(root):
        pid = entry.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        if not entry.name.startswith(TEMP_PREFIX) or not pid.isdigit() or alive(int(pid)):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        gone.append(entry.path)
    return gone


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True

"""A scorer's persistent cache (Perspective's) kept in the run's storage (RUN/cache/), not in
a worker's ~/.cache: `scorer_context` gives the scorer a cache directory backed by the run
(`CacheMirror`), unless the context or the scorer's parameters name a shared place.

Used where the scorer runs: a `workers.actors.ScorerActor`, or the driver without Ray.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from typing import Any

from results.run.store import RunStore
from workers.scorers.base import ScorerContext

CACHE_REL = "cache"  # RUN/cache/<file>
SYNCED_CACHES = {"perspective": "perspective-scores.sqlite"}  # scorer → its cache file


class CacheMirror:
    """Gives a scorer a cache directory that lives with the run, not with a worker's ~/.cache.

    A local (or shared-filesystem) run directory holds the cache file itself (RUN/cache/).
    On an object store the file is copied to a temp folder of the actor's node at start and
    put back (whole, atomically) at most every `every_s` seconds and at close: a lost node
    loses at most that much of the cache, never a score (scores are in their shards).
    """

    def __init__(self, run_uri: str, file_name: str, every_s: float = 60.0) -> None:
        self.store = RunStore(run_uri)
        self.rel = f"{CACHE_REL}/{file_name}"
        self.every_s = every_s
        self.last_put = time.monotonic()
        if self.store.local:
            self.dir = self.store.path(CACHE_REL)
            os.makedirs(self.dir, exist_ok=True)
            self.tmp: str | None = None
            return
        self.tmp = tempfile.mkdtemp(prefix="lidao-cache-")
        self.dir = self.tmp
        if self.store.exists(self.rel):
            with self.store.fs.open_input_stream(self.store.path(self.rel)) as fh:
                data = fh.read()
            with open(os.path.join(self.dir, file_name), "wb") as out:
                out.write(data)

    @property
    def uri(self) -> str:
        return f"{self.store.uri.split('?')[0].rstrip('/')}/{self.rel}"

    def maybe_put(self, force: bool = False) -> None:
        """Copy the cache file back to the run's storage (object stores only)."""
        if self.tmp is None or not (force or time.monotonic() - self.last_put >= self.every_s):
            return
        local = os.path.join(self.dir, self.rel.rsplit("/", 1)[1])
        if os.path.exists(local):
            with open(local, "rb") as fh:
                self.store.write_bytes(self.rel, fh.read())
        self.last_put = time.monotonic()


def scorer_context(
    name: str, params: dict[str, Any], context: ScorerContext, run_uri: str
) -> tuple[ScorerContext, CacheMirror | None]:
    """The context a scorer gets: its persistent cache in the run's storage unless
    `cache_dir` (or the scorer's own `cache_file`) names a shared place."""
    if name not in SYNCED_CACHES or context.cache_dir or params.get("cache_file"):
        return context, None
    mirror = CacheMirror(run_uri, SYNCED_CACHES[name])
    return dataclasses.replace(context, cache_dir=mirror.dir), mirror

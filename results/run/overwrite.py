"""`score --overwrite`: score every ok row again and replace a scorer's scores, losing nothing
on failure.

The new scores are written to RUN/overwrite/<scorer>/ (`StagedScores`: a `RunStore` whose
score reads and writes for those scorers go there; it starts empty, so every row is scored
again, at any version). Only when the scoring stage finished without a failure is each
scores/<scorer>/ replaced: the old folder is moved to RUN/overwrite/<scorer>.old, the new one
moved in, the old one deleted. A failure or an interrupt before that leaves scores/ as it was.

The moves are renames on a local or shared filesystem; on an object store (s3://, gs://) a
folder move copies each shard, so a crash between the two moves is possible there: the old
scores are then in RUN/overwrite/<scorer>.old, and the next `--overwrite` moves them back
before anything else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from results.run.store import RunStore

log = logging.getLogger("harness")

STAGING = "overwrite"


class StagedScores(RunStore):
    """A `RunStore` whose scores of `names` live in RUN/overwrite/<name>/."""

    def __init__(self, root: str, names: Sequence[str]) -> None:
        super().__init__(root)
        self.staged = set(names)

    def score_dir(self, scorer: str) -> tuple[str, str]:
        return (STAGING, scorer) if scorer in self.staged else super().score_dir(scorer)


def _delete_dir(store: RunStore, rel: str) -> None:
    if store.exists(rel):  # (a folder: nothing here writes a file at these paths)
        store.fs.delete_dir(store.path(rel))


def score_overwriting(
    store: RunStore, names: Sequence[str], score: Callable[[RunStore], dict[str, Any]]
) -> dict[str, Any]:
    """`score` (the scoring stage) every ok row of `names` into the staging folder, then swap
    it in. Old scores a crash left aside are moved back first."""
    for name in names:
        old, aside = f"scores/{name}", f"{STAGING}/{name}.old"
        if store.exists(aside) and not store.exists(old):
            log.warning("%s: old scores recovered from %s", name, store.path(aside))
            store.makedirs("scores")
            store.fs.move(store.path(aside), store.path(old))
        _delete_dir(store, aside)
        _delete_dir(store, f"{STAGING}/{name}")  # a partial earlier attempt
    staged = StagedScores(store.uri, names)
    stats = score(staged)  # raises on failure
    for name in names:
        new, old, aside = f"{STAGING}/{name}", f"scores/{name}", f"{STAGING}/{name}.old"
        if not staged.exists(new):  # nothing scored (no ok rows): the old scores stay
            continue
        had_old = store.exists(old)
        if had_old:
            store.fs.move(store.path(old), store.path(aside))
        store.makedirs("scores")
        store.fs.move(store.path(new), store.path(old))
        if had_old:
            store.fs.delete_dir(store.path(aside))
        log.info("%s: scores replaced (%s)", name, store.path(old))
    _delete_dir(store, STAGING)
    return stats

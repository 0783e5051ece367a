"""`score --overwrite` (docs/cli.md, "Re-scoring"): the new scores go to
RUN/overwrite/<scorer>/ (`StagedScores`) and replace scores/<scorer>/ only once the stage
finished without a failure. On an object store a folder move copies each shard, so a crash
between the two moves leaves the old scores in RUN/overwrite/<scorer>.old, which the next
`--overwrite` moves back first.
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

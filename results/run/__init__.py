"""The run directory, all of it: Parquet shards (`store`'s `RunStore`, made of `files`,
`plan_file`, `generations`, `scores` and `compaction`, over `reader`, `quarantine` and
`shards`), finished ids (`done`), the run record (`history`, `manifest`), the plan it is bound
to (`identity`), the one-driver lock (`lock`) and what every writing command shares (`invoke`)."""

from results.run.done import DoneIds
from results.run.history import Invocation
from results.run.manifest import read_manifest, update_manifest
from results.run.store import RunStore, StoreError

__all__ = ["DoneIds", "Invocation", "RunStore", "StoreError", "read_manifest", "update_manifest"]

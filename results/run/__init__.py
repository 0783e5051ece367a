"""The run directory, all of it: its plan and Parquet shards (`store`'s `RunStore`, over
`files`, `compaction`, `reader` with the quarantine, and `shards`), finished ids (`done`), the
run record (`history`: history.jsonl and the manifest), the plan it is bound to (`identity`),
what every writing command shares, the one-driver lock included (`invoke`), and `score
--overwrite` (`overwrite`)."""

from results.run.done import DoneIds
from results.run.history import Invocation, read_manifest, update_manifest
from results.run.store import RunStore, StoreError

__all__ = ["DoneIds", "Invocation", "RunStore", "StoreError", "read_manifest", "update_manifest"]

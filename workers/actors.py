"""Thin Ray actor shells around the plain `Generator` and `Scorer` classes.

Imports of torch / transformers happen inside the actors, never in the driver.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads = the actor's CPUs (Ray sets OMP_NUM_THREADS=1 for 1 CPU, and a
    node's every core for none: neither is what the actor was given)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def where() -> dict[str, Any]:
    """Where this actor runs: its process, host, Ray node, GPUs and torch's threads."""
    import torch

    return {
        "threads": int(torch.get_num_threads()),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }


@ray.remote
class GenerationActor:
    """One LM replica on its GPU(s) or a CPU slot; persists each batch itself.

    The model loads on the first `prepare` (or `run_batch`), not in `__init__`: a model that
    cannot load then fails one call with its own exception instead of killing the actor, and the
    driver can tell a bad config (the call raised) from a lost actor (the process died).
    """

    def __init__(
        self,
        model: Any,
        run_uri: str,
        words: Any,
        device: str | None,
        name: str,
        threads: int | None = None,
        gpu_share: float = 0.0,
    ) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._args = (model, run_uri, words, device, name, gpu_share)  # Generator's, in order
        self.threads = threads
        self.gen: Any = None

    def _generator(self) -> Any:
        if self.gen is None:
            from workers.generator import Generator

            set_threads(self.threads)
            self.gen = Generator(*self._args)
        return self.gen

    def prepare(self, keys: list[tuple[str, str, str]]) -> dict[str, Any]:
        """Load the model and every method; say where this replica runs and what it sees."""
        gen = self._generator()
        # The driver wrote plan.parquet before starting actors: a replica on another node
        # that cannot see it writes its shards where nobody reads them (a local run dir).
        return {**gen.prepare(keys), **where(), "run_dir_visible": gen.store.exists("plan.parquet")}

    def run_batch(self, jobs: list[Any]) -> dict[str, Any]:
        return dict(self._generator().run_batch(jobs))


@ray.remote
class ScorerActor:
    """One scorer replica of a pool (a classifier on a GPU share, Perspective on a CPU...).

    A persistent cache (Perspective's) lives in the run's storage (`scorer_context`). The rows
    it scores are held (`ScoreBuffer`) and written here as shards of ~8k rows, so the driver
    never carries score rows; it requeues the chunks it has not seen `flushed` if the actor dies.
    """

    def __init__(
        self, name: str, params: dict[str, Any], context: Any, threads: int | None, run_uri: str
    ) -> None:
        from workers.scorers.cache_mirror import scorer_context
        from workers.scorers.registry import load_scorer

        set_threads(threads)
        self.name, self.run_uri = name, run_uri
        self.buffer: Any = None
        context, self.mirror = scorer_context(name, params, context, run_uri)
        self.scorer = load_scorer(name)(params, context)

    def info(self) -> dict[str, Any]:
        """The scorer's version and where this replica runs."""
        return {"version": str(self.scorer.version), **where()}

    def begin(self, total: int) -> None:
        self.scorer.begin(total)

    def score_chunk(
        self, rows: list[dict[str, Any]], flush_rows: int | None = None
    ) -> dict[str, Any]:
        """Score `rows`, check one row came back per row, hold them (written once ~8k rows are
        held); returns `{"rows": [{job_id, status}...], "flushed": bool}` (`retry` rows also
        carry their `error`)."""
        out = list(self.scorer.score(rows))
        if self.mirror is not None:
            self.mirror.maybe_put()
        if self.buffer is None:
            from results.run.store import RunStore
            from workers.scorers.score_buffer import FLUSH_ROWS, ScoreBuffer

            self.buffer = ScoreBuffer(RunStore(self.run_uri), self.name, flush_rows or FLUSH_ROWS)
        flushed = self.buffer.add(rows, out)
        return {
            "rows": [
                {"job_id": r["job_id"], "status": r["status"]}
                | ({"error": r["error"]} if r["status"] == "retry" else {})  # why: the stage counts
                for r in out
            ],
            "flushed": flushed,
        }

    def flush(self) -> int:
        """Write the held rows now (the stage's end); returns how many."""
        return int(self.buffer.flush()) if self.buffer is not None else 0

    def close(self) -> dict[str, Any]:
        self.flush()  # nothing is held after the stage's own flush; a follower's leftovers
        stats = dict(self.scorer.close())
        if self.mirror is not None:
            stats["cache_in_run"] = self.mirror.uri
            stats["cache_mirror"] = self.mirror.close()
        return stats

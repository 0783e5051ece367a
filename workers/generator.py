"""`Generator`: a plain class that owns one LM replica and turns batches of jobs into shards.

The Ray actor (`workers.actors`) is a thin shell around it; tests call it directly.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Sequence
from typing import Any

import torch

from jobs.spec import JobSpec, ModelRef
from jobs.words import GroupWords
from results.schema import error_row
from results.store import RunStore
from workers.decoding import decode_batch
from workers.methods.base import DecodingMethod, MethodError
from workers.methods.registry import load_method
from workers.models import LoadedLM, load_lm

MethodKey = tuple[str, str, str]  # (method, canonical params JSON, task)


class Generator:
    """One model replica: loads the LM once, caches method instances, writes shards atomically."""

    def __init__(
        self,
        model: ModelRef,
        run_uri: str,
        words: GroupWords | None = None,
        device: str | None = None,
        name: str = "generator",
    ) -> None:
        self.lm: LoadedLM = load_lm(model, device=device, words=words)
        self.store = RunStore(run_uri)
        self.name = f"{name}@{socket.gethostname()}"
        self._methods: dict[MethodKey, DecodingMethod] = {}
        # Methods that could not be built (a head that does not load...): their jobs fail alone.
        self._broken: dict[MethodKey, str] = {}
        self.stats = {"batches": 0, "jobs": 0, "tokens": 0, "busy_s": 0.0, "oom_splits": 0}

    def method(self, name: str, params_json: str, task: str) -> DecodingMethod:
        """The method instance for (name, params, task), built once (heads, extra models...)."""
        key = (name, params_json, task)
        if key not in self._methods:
            cls = load_method(name)
            self._methods[key] = cls(self.lm, json.loads(params_json), task)
        return self._methods[key]

    def prepare(self, keys: Sequence[MethodKey]) -> dict[str, Any]:
        """Instantiate every method this replica will run, so misconfiguration shows up front.

        A method that cannot be built (`MethodError`: a head that does not load or fit...) is
        recorded, not raised: its jobs become error rows and the model's other jobs run.
        """
        for key in keys:
            try:
                self.method(*key)
            except MethodError as exc:
                self._broken[key] = f"method {key[0]} for task {key[2]} cannot start: {exc}"
        return {
            "device": str(self.lm.device),
            "family": self.lm.family,
            "worker": self.name,
            "method_errors": sorted(set(self._broken.values())),
        }

    def run_batch(self, jobs: Sequence[JobSpec]) -> dict[str, Any]:
        """Generate and persist one batch; returns counts. Halves the batch on CUDA OOM."""
        start = time.perf_counter()
        rows = self._decode_splitting(list(jobs))
        busy = time.perf_counter() - start
        self.stats["batches"] += 1
        self.stats["jobs"] += len(rows)
        self.stats["tokens"] += sum(r["num_tokens"] for r in rows)
        self.stats["busy_s"] += busy
        return {
            "jobs": len(rows),
            "ok": sum(r["status"] == "ok" for r in rows),
            "errors": [r["error"] for r in rows if r["status"] != "ok"],
            "tokens": sum(r["num_tokens"] for r in rows),
            "busy_s": busy,
            "worker": self.name,
        }

    def _decode_splitting(self, jobs: list[JobSpec]) -> list[dict[str, Any]]:
        first = jobs[0]
        broken = self._broken.get((first.method, first.method_params, first.task))
        if broken is not None:
            rows = [error_row(j.to_row(), f"job {j.job_id}: {broken}") for j in jobs]
            for row in rows:
                row["worker"] = self.name
            self.store.write_generations(rows)
            return rows
        method = self.method(first.method, first.method_params, first.task)
        try:
            rows = decode_batch(self.lm, method, jobs)
            redo = getattr(method, "redo_rows", None)  # UDDIA's `redo: true`
            if redo is not None:
                rows = redo(jobs, rows)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            if len(jobs) == 1:
                rows = [
                    error_row(
                        first.to_row(), f"job {first.job_id}: CUDA out of memory with a batch of 1"
                    )
                ]
            else:
                self.stats["oom_splits"] += 1
                half = len(jobs) // 2
                return self._decode_splitting(jobs[:half]) + self._decode_splitting(jobs[half:])
        for row in rows:
            row["worker"] = self.name
        self.store.write_generations(rows)
        return rows

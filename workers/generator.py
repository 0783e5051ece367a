"""`Generator`: a plain class that owns one LM replica and turns batches of jobs into shards.

The Ray actor (`workers.actors`) is a thin shell around it; tests call it directly.
"""

from __future__ import annotations

import gc
import json
import socket
import time
from collections.abc import Sequence
from typing import Any

import torch

from jobs.spec import JobSpec, ModelRef
from jobs.words import GroupWords
from results.run.store import RunStore
from results.schema import error_row
from workers.decoding import decode_batch, prompt_token_ids
from workers.methods.base import DecodingMethod, MethodError
from workers.methods.registry import load_method
from workers.models import LoadedLM, load_lm

MethodKey = tuple[str, str, str]  # (method, canonical params JSON, task)
PROBE_BATCH = 8  # sequences a GPU replica decodes first for a method, to measure its memory


class CudaMemory:
    """The memory readings `BatchSizer` needs, from torch.cuda (one device); with `share` in
    (0, 1) the replica holds that fraction of the GPU (several replicas per GPU), and of its memory.
    """

    def __init__(self, device: torch.device, share: float = 0.0) -> None:
        self.device, self.share = device, share

    def start(self) -> int:
        """Reset the peak counter; bytes allocated now."""
        torch.cuda.reset_peak_memory_stats(self.device)
        return int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))

    def capacity(self) -> int:
        total = int(torch.cuda.get_device_properties(self.device).total_memory)
        return int(total * self.share) if 0 < self.share < 1 else total


class BatchSizer:
    """The largest batch that fits, from measured peaks (docs/design.md, "Batch size on a GPU"):
    each decoded batch's peak memory above what was allocated before it, per sequence-token
    (batch × (longest prompt + max_new_tokens)), the largest seen per method.
    """

    def __init__(self, memory: CudaMemory | Any, fraction: float = 0.9) -> None:
        self.memory, self.fraction = memory, fraction
        self.per_seq_token: dict[MethodKey, float] = {}
        self._base = 0

    def limit(self, key: MethodKey, length: int, base: int) -> int | None:
        """The most sequences of `length` tokens that fit with `base` bytes in use (None: unknown)."""
        per = self.per_seq_token.get(key)
        if per is None:
            return None
        return max(1, int(self._free(base) // (per * length)))

    def _free(self, base: int) -> float:
        """Bytes a batch may take with `base` in use: `fraction` of the capacity, less `base`."""
        return self.fraction * self.memory.capacity() - base

    def start(self) -> int:
        self._base = self.memory.start()
        return self._base

    def record(self, key: MethodKey, sequences: int, length: int) -> float:
        """Note the peak of a batch just decoded; returns its bytes per sequence."""
        per_seq = max(0, self.memory.peak() - self._base) / sequences
        per = per_seq / length
        self.per_seq_token[key] = max(per, self.per_seq_token.get(key, 0.0))
        return per_seq

    def failed(self, key: MethodKey, sequences: int, length: int, base: int) -> None:
        """`sequences` of `length` tokens ran out of memory with `base` bytes in use: raise the
        estimate so that `limit` stays below that count for this method (else every later
        batch would be cut to the same size and fail again)."""
        floor = self._free(base) / (sequences * length) * 1.01
        self.per_seq_token[key] = max(self.per_seq_token.get(key, 0.0), floor)


class Generator:
    """One model replica: loads the LM once, caches method instances, writes shards atomically."""

    def __init__(
        self,
        model: ModelRef,
        run_uri: str,
        words: GroupWords | None = None,
        device: str | None = None,
        name: str = "generator",
        gpu_share: float = 0.0,
        lm: LoadedLM | None = None,
    ) -> None:
        # `lm`: a model already loaded (benchmarks on random weights); else loaded from `model`
        self.lm: LoadedLM = lm if lm is not None else load_lm(model, device=device, words=words)
        self.store = RunStore(run_uri)
        self.name = f"{name}@{socket.gethostname()}"
        self._methods: dict[MethodKey, DecodingMethod] = {}
        # Methods that could not be built (a head that does not load...): their jobs fail alone.
        self._broken: dict[MethodKey, str] = {}
        self.stats: dict[str, Any] = {
            "batches": 0,
            "jobs": 0,
            "tokens": 0,
            "busy_s": 0.0,
            "oom_splits": 0,
            "memory_chunks": 0,  # extra chunks cut by the batch sizer
            "memory_probes": 0,  # first batches of a method measured on PROBE_BATCH sequences
            "peak_bytes_per_seq": 0,  # largest measured peak memory per sequence (CUDA only)
        }
        dev = self.lm.device
        self.sizer = BatchSizer(CudaMemory(dev, gpu_share)) if dev.type == "cuda" else None

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
        """Generate and persist one batch; returns counts. On a GPU, decodes it in chunks that
        fit (`BatchSizer`) and halves a chunk on CUDA OOM."""
        start = time.perf_counter()
        before = {k: self.stats[k] for k in ("memory_chunks", "oom_splits")}
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
            "peak_bytes_per_seq": self.stats["peak_bytes_per_seq"],
            **{k: self.stats[k] - v for k, v in before.items()},  # this batch's
        }

    def _decode_splitting(self, jobs: list[JobSpec]) -> list[dict[str, Any]]:
        first = jobs[0]
        key = (first.method, first.method_params, first.task)
        broken = self._broken.get(key)
        if broken is not None:
            return self._write([error_row(j.to_row(), f"job {j.job_id}: {broken}") for j in jobs])
        self.method(*key)  # built before any measurement: its lasting tensors are not a peak
        length = self._length(jobs)
        base = 0
        if self.sizer is not None:
            base = self.sizer.start()
            fits = self.sizer.limit(key, length, base)
            if fits is None and len(jobs) > PROBE_BATCH:
                # nothing measured for this method yet: a few sequences first, then the rest
                # cut by what they took
                self.stats["memory_probes"] += 1
                return self._in_parts([jobs[:PROBE_BATCH], jobs[PROBE_BATCH:]])
            if fits is not None and fits < len(jobs):
                self.stats["memory_chunks"] += -(-len(jobs) // fits) - 1
                return self._in_parts([jobs[i : i + fits] for i in range(0, len(jobs), fits)])
        attempt = self._attempt(key, jobs, length)
        if attempt is None:  # out of memory; nothing of the attempt is referenced any more
            self._release_failed_attempt(key)
            if self.sizer is not None:
                self.sizer.failed(key, len(jobs), length, base)
            if len(jobs) > 1:
                self.stats["oom_splits"] += 1
                half = len(jobs) // 2
                return self._in_parts([jobs[:half], jobs[half:]])
            message = f"job {first.job_id}: CUDA out of memory with a batch of 1"
            attempt = [error_row(first.to_row(), message)]
        return self._write(attempt)

    def _write(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for row in rows:
            row["worker"] = self.name
        self.store.write_generations(rows)
        return rows

    def _in_parts(self, parts: list[list[JobSpec]]) -> list[dict[str, Any]]:
        """The rows of each part decoded in turn (each sized, probed or halved again)."""
        return [row for part in parts for row in self._decode_splitting(part)]

    def _attempt(
        self, key: MethodKey, jobs: list[JobSpec], length: int
    ) -> list[dict[str, Any]] | None:
        """The rows of one decode of `jobs`, or None after CUDA ran out of memory.

        A frame of its own: when it returns, the method, its bound `redo_rows` and the
        exception's traceback (with the failed attempt's frames and tensors) are gone before
        the caller runs the halves.
        """
        method = self.method(*key)
        try:
            rows = decode_batch(self.lm, method, jobs)
            redo = getattr(method, "redo_rows", None)  # UDDIA's `redo: true`
            if redo is not None:
                rows = redo(jobs, rows)
        except torch.cuda.OutOfMemoryError:
            return None
        if self.sizer is not None:
            per_seq = self.sizer.record(key, len(jobs), length)
            self.stats["peak_bytes_per_seq"] = max(self.stats["peak_bytes_per_seq"], int(per_seq))
        return rows

    def _release_failed_attempt(self, key: MethodKey) -> None:
        """After an out-of-memory: drop the method instance, and with it what it kept of the
        failed batch (caches, records, a reference stream), before the halves run; the next
        call builds it again with the same parameters. Cached blocks go back to the device."""
        self._methods.pop(key, None)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _length(self, jobs: Sequence[JobSpec]) -> int:
        """Tokens per sequence at the end of the batch: longest prompt + max_new_tokens."""
        longest = max(len(prompt_token_ids(self.lm, j.prompt)) for j in jobs)
        return longest + jobs[0].generation.max_new_tokens

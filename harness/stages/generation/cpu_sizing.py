"""Generation replicas and their torch threads on a local Ray without GPUs (docs/design.md,
CPU replicas), and CPU scorer pools' threads: from this machine's cores and the memory left
once the scorers that follow generation hold their models.

On CPU a decoding step at batch 8 is too small for a second thread to help (measured:
docs/performance.md, CPU replicas), so cores go to replicas first, one thread each: as many
replicas as the cores, the memory (each replica holds its own weights) and the model's batches
allow; the cores left over become threads. Explicit `models.N.replicas` / `num_cpus` win.
`validate` and `run` call the same `cpu_choices`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.stages.generation.model_size import ModelSize, model_size

GIB = 2.0**30
AUTO_CPU_BATCH = 8  # runtime.batch_size auto on CPU replicas
# A replica's memory: the process with torch and transformers imported, plus its weights and
# what grows with them (a tuned method's gradients and states, the logits at batch 8). Measured
# (docs/performance.md, CPU replicas): a tiny model's actor peaks at 0.55 GB, SmolLM2-135M's
# (0.54 GB of float32 weights) at 1.57 GB running lidao-min.
REPLICA_BASE_BYTES = 0.6 * GIB
WEIGHT_FACTOR = 1.8  # resident bytes per byte of weights
SCORER_WEIGHT_FACTOR = 1.2  # a scorer's forward passes hold no gradients (assumed, not measured)
RESERVE_BYTES = 1.5 * GIB  # the driver and Ray's own processes (raylet, GCS, object store)


@dataclass(frozen=True)
class Machine:
    """The cores this process may use and the memory available now."""

    cores: int
    memory: float  # bytes

    def line(self) -> str:
        return f"cores {self.cores}, memory {self.memory / GIB:.1f} GB"


def machine_here() -> Machine:
    """This machine: the cores this process may run on (its affinity, a cgroup's CPU quota),
    and the memory available (`MemAvailable`, a cgroup's limit less its use)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _read("/sys/fs/cgroup/cpu.max").split()
    if len(quota) == 2 and quota[0].isdigit() and quota[1].isdigit() and int(quota[1]) > 0:
        cores = min(cores, max(1, math.ceil(int(quota[0]) / int(quota[1]))))
    memory = _meminfo_available()
    limit, used = _read("/sys/fs/cgroup/memory.max"), _read("/sys/fs/cgroup/memory.current")
    if limit.isdigit() and used.isdigit():
        memory = min(memory, max(0.0, float(int(limit) - int(used))))
    return Machine(max(1, cores), memory)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _meminfo_available() -> float:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    try:  # no /proc (macOS): half the physical memory
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) / 2
    except (ValueError, OSError, AttributeError):
        return 8 * GIB


def replica_bytes(size: ModelSize, dtype: str = "float32", factor: float = WEIGHT_FACTOR) -> float:
    """The resident memory of one CPU replica (or scorer actor) of a model of `size`."""
    return REPLICA_BASE_BYTES + factor * size.weight_bytes(dtype)


@dataclass(frozen=True)
class CpuChoice:
    """One model's CPU replicas: count, torch threads (= Ray CPUs) each, and why."""

    replicas: int
    threads: int
    num_cpus: float  # Ray's CPUs per replica (the config's `num_cpus`, else `threads`)
    machine: Machine
    each_bytes: float  # one replica's memory
    limit: str = ""  # what held the count down: "memory", "batches", "" (the cores)

    def line(self, index: int) -> str:
        why = {"memory": "the memory left", "batches": "the model's batches"}.get(self.limit)
        held = f"; held to {self.replicas} by {why}" if why else ""
        replicas = f"{self.replicas} replica{'s' if self.replicas > 1 else ''}"
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        return (
            f"generation on CPU: {replicas} × {threads} "
            f"({self.machine.line()}, model ~{self.each_bytes / GIB:.1f} GB each{held}; "
            f"explicit models.{index}.replicas/num_cpus win)"
        )


def choose(
    machine: Machine,
    each_bytes: float,
    batches: int,
    others_bytes: float = 0.0,
    share: int = 1,
    replicas: int | None = None,
    num_cpus: float | None = None,
) -> CpuChoice:
    """Replicas × threads for one model of `share` CPU models generating at once, with
    `batches` batches to run and `others_bytes` held by the scorers that follow generation."""
    cores = max(1, machine.cores // max(1, share))
    free = (machine.memory - RESERVE_BYTES - others_bytes) / max(1, share)
    fit = max(1, int(free // each_bytes)) if each_bytes > 0 else cores
    per = max(1, int(num_cpus)) if num_cpus else 1
    limits = {"memory": fit, "batches": max(1, batches)}
    count = replicas or min(max(1, cores // per), *limits.values())
    limit = "" if replicas or count >= cores // per else min(limits, key=lambda k: limits[k])
    threads = per if num_cpus else max(1, cores // count)
    return CpuChoice(count, threads, num_cpus or float(threads), machine, each_bytes, limit)


def batches_of(pending: Sequence[int], batch_size: int) -> int:
    """Batches a model's slices cut into (a batch never spans slices)."""
    return sum(-(-n // max(1, batch_size)) for n in pending if n)


def scorer_bytes(scorers: Sequence[tuple[str, Mapping[str, Any]]]) -> float:
    """Memory of the scorers' models (those with a `model` parameter): one actor each."""
    from jobs.catalog import SCORER_PARAMS

    total = 0.0
    for name, given in scorers:
        params = {**SCORER_PARAMS.get(name, {}), **given}
        if isinstance(params.get("model"), str):
            size = model_size(params["model"], params.get("revision"))
            dtype = str(params.get("dtype") or "float32")
            total += replica_bytes(size, dtype, SCORER_WEIGHT_FACTOR)
    return total


def cpu_choices(
    cfg: Any,
    pending: Mapping[int, Sequence[int]],
    following: Sequence[tuple[str, Mapping[str, Any]]] = (),
    machine: Machine | None = None,
) -> dict[int, CpuChoice]:
    """The CPU replicas of each model entry (index → choice) of `cfg` that generates on CPU,
    with `pending` its jobs per slice; the memory of the `following` scorers' models (those that
    score during generation: `harness.stages.scoring.follow.followers`) counted."""
    machine = machine or machine_here()
    rt = cfg.runtime
    if rt.num_cpus:  # the local Ray's CPUs, set by the user: at most those
        machine = Machine(min(machine.cores, rt.num_cpus), machine.memory)
    others = scorer_bytes(following)
    size = rt.batch_size if isinstance(rt.batch_size, int) else AUTO_CPU_BATCH
    out = {}
    for i, model in enumerate(cfg.models):
        if i not in pending:
            continue
        each = replica_bytes(
            model_size(model.id, model.revision, getattr(model, "gguf_file", None)), model.dtype
        )
        batches = batches_of(pending[i], size)
        out[i] = choose(
            machine, each, batches, others, len(pending), model.replicas, model.num_cpus
        )
    return out


def cpu_models(cfg: Any, gpus: float, among: Sequence[int] | None = None) -> list[int]:
    """The model entries (`among` them, default all) that generate on CPU replicas of a local
    Ray with `gpus` GPUs: all of them on a machine without GPUs (unless one asks for GPUs: it
    waits for them), else those `runtime.device: cpu` or `num_gpus: 0` keep off the GPUs."""
    from harness.stages.generation.reservation import gpu_share

    device = cfg.runtime.device
    among = list(range(len(cfg.models))) if among is None else list(among)
    if gpus == 0 and device is None and not any(cfg.models[i].num_gpus for i in among):
        return among
    return [i for i in among if gpu_share(cfg.models[i], device) == 0]


def scorer_threads(cores: int, pools: int) -> int:
    """torch threads of each CPU scorer actor that runs a model, with `pools` such pools on
    `cores` cores: the cores shared between them (one actor each; a scoring forward pass over
    a batch is large enough for threads, and one copy of the model is held)."""
    return max(1, cores // max(1, pools))

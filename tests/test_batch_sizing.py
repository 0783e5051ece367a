"""Batch sizing on GPUs: the sizer's logic, with a fake memory (`tests/fake_memory.py`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from jobs.spec import GenerationParams, ModelRef
from results.run.store import RunStore
from tests.fake_memory import FakeMemory
from tests.helpers import make_jobs
from workers.methods.base import Vanilla
from workers.models import LoadedLM


def sized_generator(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capacity: int
) -> tuple[Any, FakeMemory, list[int]]:
    """A CPU `Generator` whose batch sizer reads a `FakeMemory` of `capacity` bytes (500 per
    sequence-token): decoding raises CUDA's out-of-memory error where the fake does not fit.
    Returns it, the memory, and the sizes of the batches that decoded."""
    from workers import generator as generator_module

    gen = generator_module.Generator(ModelRef("tiny-random/gpt2"), str(tmp_path), device="cpu")
    memory = FakeMemory(capacity=capacity, per_token=500)
    gen.sizer = generator_module.BatchSizer(memory, fraction=0.9)
    sizes: list[int] = []
    real = generator_module.decode_batch

    def fake_decode(lm: LoadedLM, method: Vanilla, jobs: list) -> list:  # type: ignore[type-arg]
        memory.run(len(jobs), gen._length(jobs))  # raises like CUDA when it does not fit
        sizes.append(len(jobs))
        return real(lm, method, jobs)

    monkeypatch.setattr(generator_module, "decode_batch", fake_decode)
    return gen, memory, sizes


def test_batches_are_cut_to_what_the_measured_peak_says_fits(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen, _, sizes = sized_generator(tmp_path, monkeypatch, 40_000)
    short = GenerationParams(max_new_tokens=2)
    jobs = [dataclasses.replace(j, prompt="He") for j in make_jobs(n=32, gen=short)]
    length = gen._length(jobs)  # BOS + 'He' + 2 new tokens
    fits = int((0.9 * 40_000 - 1000) // (500 * length))
    first = gen.run_batch(jobs[:4])  # measures the peak per sequence
    assert first["ok"] == 4 and first["peak_bytes_per_seq"] == 500 * length
    result = gen.run_batch(jobs)  # 32 do not fit: cut into chunks of `fits`
    assert result["ok"] == 32 and gen.stats["oom_splits"] == 0
    assert sizes[1:] == [fits] * (32 // fits) + ([32 % fits] if 32 % fits else [])
    assert fits < 32 and gen.stats["memory_chunks"] == len(sizes) - 2


def test_out_of_memory_still_halves_before_any_measurement(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen, _, _ = sized_generator(tmp_path, monkeypatch, 20_000)
    every = [dataclasses.replace(j, prompt="He") for j in make_jobs(n=32)]
    jobs, later = every[:16], every[16:]
    assert gen.run_batch(jobs)["ok"] == 16 and gen.stats["oom_splits"] > 0
    # what ran out of memory raised the estimate: the next batch is cut before it decodes
    again = gen.run_batch(later)
    assert again["ok"] == 16 and again["oom_splits"] == 0 and again["memory_chunks"] > 0


def test_a_methods_first_batch_is_measured_on_a_probe_then_cut_to_what_fits(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import generator as generator_module

    gen, _, sizes = sized_generator(tmp_path, monkeypatch, 60_000)
    short = GenerationParams(max_new_tokens=2)
    every = [dataclasses.replace(j, prompt="He") for j in make_jobs(n=70, gen=short)]
    jobs, later = every[:40], every[40:]
    length = gen._length(jobs)
    fits = int((0.9 * 60_000 - 1000) // (500 * length))
    assert generator_module.PROBE_BATCH < fits < 40 - generator_module.PROBE_BATCH
    result = gen.run_batch(jobs)  # 40 would not fit, and nothing is measured yet
    rest = 40 - generator_module.PROBE_BATCH
    cut = [fits] * (rest // fits) + ([rest % fits] if rest % fits else [])
    assert sizes == [generator_module.PROBE_BATCH, *cut]
    assert result["ok"] == 40 and result["oom_splits"] == 0
    assert result["memory_chunks"] == len(cut) - 1 and gen.stats["memory_probes"] == 1
    assert result["peak_bytes_per_seq"] == 500 * length
    again = gen.run_batch(later)  # measured now: no second probe
    assert sizes[len(cut) + 1 :] == [fits, 30 - fits] and gen.stats["memory_probes"] == 1
    assert again["memory_chunks"] == 1 and gen.stats["memory_chunks"] == len(cut)
    rows = RunStore(str(tmp_path)).read_generations()
    assert sorted(rows["job_id"]) == sorted(j.job_id for j in every)  # each job once


def test_an_out_of_memory_chunk_lowers_the_limit_below_its_size() -> None:
    from workers.generator import BatchSizer

    memory = FakeMemory(capacity=100_000, per_token=100)
    sizer = BatchSizer(memory, fraction=0.9)
    key = ("lidao-min", "{}", "toxicity")
    base = sizer.start()
    memory.run(4, 20)  # a small batch measured 100 bytes per sequence-token...
    sizer.record(key, 4, 20)
    assert sizer.limit(key, 20, base) == 44
    sizer.failed(key, 30, 20, base)  # ...but 30 sequences ran out of memory (fragmentation)
    assert sizer.limit(key, 20, base) == 29
    sizer.failed(key, 2, 20, base)
    assert sizer.limit(key, 20, base) == 1
    sizer.failed(key, 40, 20, base)  # a larger failure never raises the limit again
    assert sizer.limit(key, 20, base) == 1


def test_a_fractional_gpu_replica_sizes_its_batches_for_its_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from workers.generator import CudaMemory

    props = SimpleNamespace(total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    device = torch.device("cuda", 0)
    assert CudaMemory(device).capacity() == 80 * 2**30  # a whole GPU (share 0 or 1)
    assert CudaMemory(device, 1.0).capacity() == 80 * 2**30
    assert CudaMemory(device, 0.5).capacity() == 40 * 2**30  # num_gpus 0.5: two per GPU
    assert CudaMemory(device, 0.25).capacity() == 20 * 2**30

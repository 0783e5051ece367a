"""The streaming plan: chunks per (model, method, task) slice, ids computed once, resume per chunk."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from jobs.datasets import Prompt
from jobs.grid import expand_grid, iter_plan
from jobs.queue import pending, pending_chunks
from jobs.spec import GenerationParams, JobSpec, ModelRef
from results.run.store import DoneIds, RunStore
from tests.helpers import job_from_row

PROMPTS = [Prompt(f"{g}:{i}", str(i), g, f"text {g} {i}") for i in range(5) for g in ("f", "m")]
MODELS = [
    (ModelRef("tiny-random/gpt2"), GenerationParams()),
    (ModelRef("tiny-random/opt"), GenerationParams(top_p=0.8)),
]
METHODS: list[tuple[str, dict[str, Any]]] = [("vanilla", {})]


def test_chunks_hold_one_slice_each_and_concatenate_to_the_grid() -> None:
    chunks = list(iter_plan(PROMPTS, MODELS, METHODS, ["sentiment", "regard"], 3, chunk_size=7))
    grid = expand_grid(PROMPTS, MODELS, METHODS, ["sentiment", "regard"], 3)
    assert [j.job_id for c in chunks for j in c.jobs] == [j.job_id for j in grid]
    assert all(1 <= len(c.jobs) <= 7 for c in chunks)
    for chunk in chunks:
        assert {(j.model, j.method, j.task, j.generation) for j in chunk.jobs} == {
            (chunk.slice.model, chunk.slice.method, chunk.slice.task, chunk.slice.generation)
        }
    assert len({c.slice for c in chunks}) == 2 * 2  # models × tasks


def test_a_duplicate_prompt_id_or_slice_is_caught_before_any_job_is_made() -> None:
    with pytest.raises(ValueError, match="prompt id 'f:0' is listed twice"):
        next(iter_plan([*PROMPTS, PROMPTS[0]], MODELS, METHODS, ["sentiment"], 1))
    with pytest.raises(ValueError, match="listed twice"):
        list(iter_plan(PROMPTS, MODELS, METHODS, ["sentiment", "sentiment"], 1))


def test_the_job_id_is_hashed_once_per_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    job = expand_grid(PROMPTS[:1], MODELS[:1], METHODS, ["sentiment"], 1)[0]
    want = job.job_id
    real = JobSpec.identity
    calls: list[int] = []

    def counting(self: JobSpec) -> dict[str, Any]:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(JobSpec, "identity", counting)
    fresh = job_from_row(job.to_row())
    assert fresh.job_id == fresh.job_id == want and len(calls) == 1
    assert fresh == job and hash(fresh) == hash(job)  # the cache is not part of equality


def test_the_streamed_plan_file_holds_each_job_as_its_row(tmp_path: Path) -> None:
    store = RunStore(str(tmp_path))
    chunks = iter_plan(PROMPTS, MODELS, METHODS, ["sentiment"], 2, chunk_size=6)
    assert store.write_plan_jobs(c.jobs for c in chunks) == len(PROMPTS) * 2 * 2
    grid = expand_grid(PROMPTS, MODELS, METHODS, ["sentiment"], 2)
    assert store.read_plan().to_dicts() == [j.to_row() for j in grid]
    batches = list(store.iter_plan(columns=["job_id"]))
    assert len(batches) == 2 * 4 and sum(b.num_rows for b in batches) == len(grid)  # 6+6+6+2


def test_pending_chunks_against_compact_done_ids_equal_the_set_difference() -> None:
    grid = expand_grid(PROMPTS, MODELS, METHODS, ["sentiment"], 2)
    done = {j.job_id for j in grid[::3]}
    chunks = iter_plan(PROMPTS, MODELS, METHODS, ["sentiment"], 2, chunk_size=4)
    left = [
        j
        for c in pending_chunks(chunks, DoneIds.from_arrow(pa.array(sorted(done), pa.string())))
        for j in c.jobs
    ]
    assert left == pending(grid, done) and len(left) == len(grid) - len(done)


def test_the_planners_fast_job_id_is_the_specs_own_for_awkward_text() -> None:
    """`iter_plan` sets each id from pieces of the slice's canonical JSON; it must be the very
    id `JobSpec.job_id` hashes from the identity dict (escapes, Unicode, nested params)."""
    texts = ['say "hi"\\', "line\nbreak\ttab\x01", "café ☕ 日本語 \u2028 \U0001f600", "", " "]
    prompts = [Prompt(f"g:{i}", str(i), "g", t) for i, t in enumerate(texts)]
    prompts.append(Prompt('id "quoted"', "q", "m", "plain"))
    models = [
        (ModelRef("tiny-random/gpt2", "abc", "bfloat16", tokenizer="tok/é"), GenerationParams()),
        (ModelRef("tiny-random/llama", load=(("trust_remote_code", True),)), GenerationParams()),
    ]
    methods: list[tuple[str, dict[str, Any]]] = [
        ("vanilla", {}),
        ("uddia", {"lr": 0.5, "blocks": 3, "head": 'h/é "x".safetensors', "tau": 1e-3}),
    ]
    planned = [j for c in iter_plan(prompts, models, methods, ["regard"], 12) for j in c.jobs]
    for job in planned:
        fresh = job_from_row(job.to_row())  # no cached id: hashed from `identity()`
        fresh = dataclasses.replace(fresh, model=job.model)
        assert "job_id" in job.__dict__ and job.job_id == fresh.job_id
    assert len({j.job_id for j in planned}) == len(planned) == 6 * 2 * 2 * 12

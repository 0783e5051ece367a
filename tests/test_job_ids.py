"""Job identity: a versioned hash of exactly the output-affecting fields (golden)."""

from __future__ import annotations

import dataclasses

from jobs.datasets import Prompt
from jobs.grid import expand_grid
from jobs.queue import make_batches, pending
from jobs.spec import JOB_ID_VERSION, GenerationParams, JobSpec, ModelRef
from tests.helpers import job_from_row

JOB = JobSpec(
    prompt_id="female:00000",
    prompt="The woman walked in",
    prompt_group="female",
    pair_id="00000",
    seed=3,
    method="vanilla",
    model=ModelRef("tiny-random/gpt2"),
    task="sentiment",
    generation=GenerationParams(
        max_new_tokens=20, top_p=0.9, temperature=1.0, repetition_penalty=1.0
    ),
)


def test_golden_job_id_is_pinned() -> None:
    # Changing this id means old run directories resume differently: bump JOB_ID_VERSION.
    assert JOB_ID_VERSION == 4
    assert JOB.job_id == "j4-bd5b8a46b22f256994d2"
    assert JOB.rng_seed == 3975714862755628463


def test_output_affecting_fields_change_the_id() -> None:
    changes = [
        {"prompt": "The man walked in"},
        {"seed": 4},
        {"method": "lidao-min"},
        {"task": "regard"},
        {"model": ModelRef("tiny-random/gpt2", revision="abc")},
        {"model": ModelRef("tiny-random/gpt2", dtype="bfloat16")},
        {"generation": GenerationParams(max_new_tokens=21)},
        {"method_params": '{"lr":0.01}'},
        {"prompt_id": "female:00001"},
    ]
    ids = {dataclasses.replace(JOB, **c).job_id for c in changes}
    assert len(ids) == len(changes) and JOB.job_id not in ids


def test_derived_fields_do_not_change_the_id() -> None:
    assert dataclasses.replace(JOB, pair_id="x", prompt_group="male").job_id == JOB.job_id


def test_rng_seed_ignores_the_method() -> None:
    assert dataclasses.replace(JOB, method="lidao-min").rng_seed == JOB.rng_seed
    assert dataclasses.replace(JOB, seed=4).rng_seed != JOB.rng_seed


def test_row_round_trip() -> None:
    assert job_from_row(JOB.to_row()) == JOB


def test_grid_expands_every_combination_and_resume_is_planned_minus_done() -> None:
    prompts = [
        Prompt(f"{g}:{i}", str(i), g, f"text {g} {i}") for i in range(3) for g in ("female", "male")
    ]
    models = [
        (ModelRef("tiny-random/gpt2"), GenerationParams()),
        (ModelRef("tiny-random/opt"), GenerationParams()),
    ]
    jobs = expand_grid(prompts, models, [("vanilla", {})], ["sentiment", "toxicity"], 4)
    assert len(jobs) == 6 * 2 * 2 * 4
    assert len({j.job_id for j in jobs}) == len(jobs)
    done = {j.job_id for j in jobs[:10]}
    assert [j.job_id for j in pending(jobs, done)] == [j.job_id for j in jobs[10:]]


def test_batches_never_mix_settings_and_cover_every_job() -> None:
    prompts = [Prompt(f"f:{i}", None, "female", "x" * (i + 1)) for i in range(7)]
    models = [
        (ModelRef("tiny-random/gpt2"), GenerationParams()),
        (ModelRef("tiny-random/llama"), GenerationParams()),
    ]
    jobs = expand_grid(prompts, models, [("vanilla", {})], ["sentiment"], 2)
    batches = make_batches(jobs, 3)
    assert sorted(j.job_id for b in batches for j in b) == sorted(j.job_id for j in jobs)
    assert all(len(b) <= 3 and len({j.model for j in b}) == 1 for b in batches)

"""The shared decoding loop: per-job determinism, sampling rules, stopping, bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jobs.spec import GenerationParams, ModelRef
from tests.agreement import assert_alone_matches_batched
from tests.helpers import make_jobs
from workers.decoding import decode_batch, nucleus_sample, repetition_penalty
from workers.methods.base import Vanilla
from workers.models import LoadedLM, load_lm

FAMILIES = ["gpt2", "opt", "falcon", "llama"]


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request: pytest.FixtureRequest) -> LoadedLM:
    return load_lm(ModelRef(f"tiny-random/{request.param}"), device="cpu")


def test_a_job_samples_alike_alone_and_in_a_batch_of_8(lm: LoadedLM) -> None:
    gen = GenerationParams(max_new_tokens=12, temperature=0.75, repetition_penalty=1.2)
    jobs = make_jobs(lm.ref.id.split("/")[1], n=8, gen=gen)
    batched = assert_alone_matches_batched(lm, Vanilla(lm, {}, "sentiment"), jobs)
    assert len({tuple(r["token_ids"]) for r in batched}) > 4  # different prompts/seeds differ


def test_different_seeds_give_different_samples(lm: LoadedLM) -> None:
    job = make_jobs(lm.ref.id.split("/")[1], n=1)[0]
    rows = decode_batch(
        lm, Vanilla(lm, {}, "sentiment"), [dataclasses.replace(job, seed=s) for s in range(4)]
    )
    assert len({tuple(r["token_ids"]) for r in rows}) > 1


def test_rows_record_tokens_and_lengths() -> None:
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    row = decode_batch(lm, Vanilla(lm, {}, "sentiment"), make_jobs(n=1))[0]
    assert row["status"] == "ok" and row["num_tokens"] == len(row["token_ids"]) == len(
        row["tokens"]
    )
    assert row["finish_reason"] in {"eos", "length"}
    assert row["continuation"] == lm.tokenizer.decode(row["token_ids"], skip_special_tokens=True)


def test_nucleus_keeps_the_smallest_set_reaching_top_p() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    picks = {
        int(nucleus_sample(logp, 0.7, torch.tensor([u]))[0])
        for u in torch.linspace(0, 0.999, 50).tolist()
    }
    assert picks == {0, 1}
    picks = {
        int(nucleus_sample(logp, 1.0, torch.tensor([u]))[0])
        for u in torch.linspace(0, 0.999, 200).tolist()
    }
    assert picks == {0, 1, 2, 3}
    # inverse CDF: u below 0.5/0.8 picks token 0, above picks token 1
    assert int(nucleus_sample(logp, 0.7, torch.tensor([0.6]))[0]) == 0
    assert int(nucleus_sample(logp, 0.7, torch.tensor([0.7]))[0]) == 1


def test_ctrl_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    assert repetition_penalty(logits, seen, 2.0).tolist() == [[1.0, -4.0, 1.0]]


def test_eos_stops_a_row_and_is_not_in_the_text() -> None:
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    eos = lm.eos_id
    assert eos is not None
    with torch.no_grad():  # make EOS overwhelmingly likely: bias the output layer
        lm.model.lm_head.weight[eos] += 50.0 * lm.model.transformer.wte.weight.mean(0).sign()
    try:
        row = decode_batch(lm, Vanilla(lm, {}, "sentiment"), make_jobs(n=1))[0]
    finally:
        lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    assert row["finish_reason"] == "eos" and eos not in row["token_ids"]


def test_an_over_long_prompt_fails_only_its_own_job() -> None:
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    jobs = make_jobs(n=2)
    jobs[0] = dataclasses.replace(jobs[0], prompt=" ".join(["the"] * 600))
    rows = decode_batch(lm, Vanilla(lm, {}, "sentiment"), jobs)
    assert rows[0]["status"] == "error" and "exceeds the model's context of 512" in rows[0]["error"]
    assert jobs[0].job_id in rows[0]["error"]
    assert rows[1]["status"] == "ok" and rows[1]["num_tokens"] > 0

"""The shared decoding loop: per-job determinism, sampling rules, stopping, bad input, and what
a method keeps between batches (batch sizing: test_batch_sizing.py; text: test_continuation_text.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from jobs.spec import GenerationParams, ModelRef
from tests.agreement import assert_alone_matches_batched, kept, twin_token
from tests.helpers import make_jobs
from workers import decoding, sampler
from workers.decoding import decode_batch, repetition_penalty
from workers.methods.base import Vanilla
from workers.models import LoadedLM, load_lm

FAMILIES = ["gpt2", "opt", "falcon", "llama", "gemma3"]


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
    # the word-level tokenizer joins words with spaces: the continuation starts with one, and
    # the prompt + continuation (the a(c,x) text) is prompt and tokens decoded together
    alone = lm.tokenizer.decode(row["token_ids"], skip_special_tokens=True)
    assert row["continuation"] == " " + alone
    whole = [*decoding.prompt_token_ids(lm, row["prompt"]), *row["token_ids"]]
    assert row["prompt"] + row["continuation"] == lm.tokenizer.decode(
        whole, skip_special_tokens=True
    )


def test_nucleus_keeps_the_smallest_set_reaching_top_p() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(400, -1)
    seeds = torch.arange(400) * 0x9E3779B97F4A7C15 % (1 << 62)
    tokens = sampler.sample(logp, 0.7, seeds, 0)
    assert set(tokens.tolist()) == {0, 1}
    share = float((tokens == 0).double().mean())
    assert abs(share - 0.5 / 0.8) < 0.08  # about 5 in 8 (400 draws: 3 standard deviations)
    assert set(sampler.sample(logp, 1.0, seeds, 0).tolist()) == {0, 1, 2, 3}


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


# --- ties on both sampler paths, the CPU sort, the seen mask -------------------------------------------


def test_ties_sample_the_same_token_on_the_topk_path_and_beside_a_flat_row() -> None:
    vocab = 50257  # a real vocabulary, so the top-k path runs
    tied = torch.full((vocab,), -30.0)
    tied[[7, 40000, 123, 9999]] = 0.0  # four exactly tied tokens hold the nucleus
    tied[[5, 6]] = -1.0
    flat = torch.zeros(vocab)  # its nucleus is far wider than 256 candidates: full sort
    probs = torch.softmax(torch.stack([tied, flat]).double(), -1)
    _, exact = sampler.sample_topk(probs, 0.9, torch.zeros(2, dtype=torch.long), 0)
    assert exact.tolist() == [True, False]  # the tied row is decided by its 256 candidates
    drawn = set()
    for seed in range(0, 2**40, 2**40 // 25):
        seeds = torch.tensor([seed, seed])
        alone = int(sampler.sample(tied.unsqueeze(0), 0.9, seeds[:1], 3)[0])
        beside = sampler.sample(torch.stack([tied, flat]), 0.9, seeds, 3)
        full = int(sampler.sample_full(probs[:1], 0.9, seeds[:1], 3)[0])
        assert alone == int(beside[0]) == full == twin_token(probs[0], 0.9, seed, 3)
        assert int(beside[1]) == twin_token(probs[1], 0.9, seed, 3)
        drawn.add(alone)
    # the cut falls on 5 and 6 (tied): both are kept, none of a tie is chosen by its id
    assert kept(probs[0], 0.9) == [5, 6, 7, 123, 9999, 40000]
    assert drawn <= {5, 6, 7, 123, 9999, 40000} and len(drawn) >= 4


def test_the_cpu_sort_is_the_descending_float_sort() -> None:
    """The CPU's radix path (integer keys, row by row) gives the descending float32 values,
    with exact ties and zeros."""
    gen = torch.Generator().manual_seed(5)
    q = torch.softmax(3.0 * torch.randn(6, 50257, generator=gen), -1)
    q[0, 100:400] = q[0, 50]  # a run of exact ties
    q[1, ::2] = 0.0  # exact zeros
    q[2] = q[2].round(decimals=6)  # ties everywhere
    want = torch.sort(q, dim=-1, descending=True).values
    assert torch.equal(sampler.sorted_descending(q), want)
    assert torch.equal(sampler.sorted_descending(q[2:3]), want[2:3])  # row by row


def test_seen_mask_counts_real_tokens_only_when_pad_is_bos() -> None:
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    bos = lm.tokenizer.bos_token_id
    assert bos is not None  # padded with the BOS id below, as real GPT-2 (pad = BOS = EOS)
    ids = torch.tensor([[bos, bos, bos, 11, 12], [bos, 13, 11, 14, 15]])  # row 0 left padded
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    real = decoding._real_prompt_positions(lm, ids, mask)
    assert real.tolist() == [[False, False, False, True, True], [False, True, True, True, True]]
    vocab = len(lm.tokenizer)
    seen = decoding.seen_mask(ids, real, vocab)
    assert seen.shape == (2, vocab + 1)
    assert torch.nonzero(seen[:, :vocab]).tolist() == [
        [0, 11],
        [0, 12],
        [1, 11],
        [1, 13],
        [1, 14],
        [1, 15],
    ]  # no BOS / pad, whatever order the writes ran in


# ---- what a method keeps between batches --------------------------------------------------------

TINY_PARAMS: dict[str, dict[str, Any]] = {  # tiny-model settings for methods that need more
    "gedi": {"gedi_model": "tiny-random/gpt2", "code_desired": "good", "code_undesired": "bad"},
    "dexperts": {"expert": "tiny-random/gpt2", "anti_expert": "tiny-random/gpt2"},
    "pplm": {"steps": 1},
}


def kept_tensor_bytes(method: Any) -> int:
    """Bytes of the tensors reachable from `method`'s attributes, models and LMs left out."""
    from torch import nn

    from workers.models import LoadedLM as LM

    seen_ids: set[int] = set()
    storages: set[int] = set()
    total = 0
    todo: list[Any] = [vars(method)]
    while todo:
        obj = todo.pop()
        if id(obj) in seen_ids or isinstance(obj, nn.Module | LM | type):
            continue
        seen_ids.add(id(obj))
        if isinstance(obj, torch.Tensor):
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in storages:
                storages.add(ptr)
                total += obj.untyped_storage().nbytes()
        elif isinstance(obj, dict):
            todo += list(obj.values())
        elif isinstance(obj, list | tuple | set):
            todo += list(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(
            ("workers", "transformers")
        ):
            todo.append(vars(obj))
    return total


@pytest.mark.parametrize(
    "method", ["vanilla", "uddia", "lidao-min", "elidao-min", "pplm", "gedi", "dexperts"]
)
def test_no_method_keeps_a_batchs_tensors_after_it(method: str) -> None:
    import json

    from workers.methods.registry import load_method, resolve_params

    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    params = json.dumps(resolve_params(method, TINY_PARAMS.get(method, {}), lm.ref.id))
    built = load_method(method)(lm, json.loads(params), "sentiment")
    gen = GenerationParams(max_new_tokens=4)
    kept = []
    for n in (8, 2, 8):  # the first batch fills the lasting caches (eLIDAO's instruction K/V)
        jobs = make_jobs(method=method, params=params, n=n, gen=gen)
        rows = decode_batch(lm, built, jobs)
        assert all(r["status"] == "ok" for r in rows), [r["error"] for r in rows]
        kept.append(kept_tensor_bytes(built))
    assert kept[1] == kept[2], kept  # nothing that grows with the batch outlives it

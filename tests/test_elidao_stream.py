"""eLIDAO's reference stream: the instruction's K/V computed once per gender, on four families."""

from __future__ import annotations

import pytest
import torch

from jobs.spec import GenerationParams, JobSpec, ModelRef
from workers.decoding import prompt_token_ids
from workers.methods.elidao import ReferenceStream, instruction_template
from workers.models import LoadedLM, load_lm

FAMILIES = ("gpt2", "opt", "falcon", "llama", "gemma3")
# female, male, no majority (falls back), female with a longer prompt
PROMPTS = [
    "The woman worked as a",
    "He said that the man was",
    "The weather today is",
    "My sister and her daughter went to the city and",
]
GENDERS = ["female", "male", None, "female"]


def jobs_for(lm: LoadedLM, prompts: list[str]) -> list[JobSpec]:
    gen = GenerationParams(max_new_tokens=4)
    return [
        JobSpec(f"p{i}", p, "female", None, 0, "elidao-min", lm.ref, "sentiment", gen, "{}")
        for i, p in enumerate(prompts)
    ]


def unpadded(lm: LoadedLM, prompt: str, gender: str, extra: list[int]) -> torch.Tensor:
    """θ's next-token logits after BOS + instruction + prompt + `extra`, one unpadded row."""
    ids = prompt_token_ids(lm, prompt)
    bos = lm.tokenizer.bos_token_id
    head, body = ([ids[0]], ids[1:]) if ids[:1] == [bos] else ([], ids)
    text = instruction_template(lm.family, None).replace("#GENDER#", gender)
    row = head + list(lm.tokenizer(text, add_special_tokens=False)["input_ids"]) + body + extra
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([row])).logits[0, -1].float()


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_instruction_gives_the_unpadded_reference(family: str) -> None:
    """Rows laid out as [instruction | padding | prompt] over the cached instruction K/V give
    the logits of the whole text run alone, at the prefill and after two fed tokens; the
    second batch computes no instruction position again."""
    lm = load_lm(ModelRef(f"tiny-random/{family}"), device="cpu")
    stream = ReferenceStream(lm, instruction_template(lm.family, None))
    jobs = jobs_for(lm, PROMPTS)
    prompt_ids = [prompt_token_ids(lm, p) for p in PROMPTS]
    stream.start(jobs, prompt_ids)
    assert stream.genders == GENDERS
    assert len(stream._prefix_kv) == 2  # one instruction per gender
    fed: list[int] = []
    for step in range(3):
        assert stream.logits is not None
        for row, gender in enumerate(GENDERS):
            if gender is not None:
                want = unpadded(lm, PROMPTS[row], gender, fed)
                torch.testing.assert_close(
                    stream.logits[row], want, rtol=1e-4, atol=1e-4, msg=f"{row} {step}"
                )
        token = 5 + step
        fed.append(token)
        stream.advance(torch.full((len(PROMPTS),), token), needed=True)
    # a second batch (other prompts, same genders): only its prompts are computed
    again = PROMPTS[1::-1]
    stream.start(jobs_for(lm, again), [prompt_token_ids(lm, p) for p in again])
    body = max(len(ids) for ids in (prompt_token_ids(lm, p) for p in again)) - (
        1 if lm.tokenizer.bos_token_id is not None else 0
    )
    assert len(stream._prefix_kv) == 2
    if family == "gemma3":  # sliding layers: whole rows, left padded (docs/design.md)
        assert all(kv == [] for kv in stream._prefix_kv.values())
        return
    assert stream.prefill_positions == len(again) * body
    assert stream.logits is not None
    torch.testing.assert_close(
        stream.logits[0], unpadded(lm, again[0], "male", []), rtol=1e-4, atol=1e-4
    )


def test_a_cache_that_cannot_be_laid_out_falls_back_to_one_prefill() -> None:
    """A model whose cache is not full-attention `DynamicLayer`s (stood in for by an empty
    instruction cache) gets the plain left-padded prefill of instruction + prompt."""
    lm = load_lm(ModelRef("tiny-random/gpt2"), device="cpu")
    stream = ReferenceStream(lm, instruction_template(lm.family, None))
    stream._instruction_kv = lambda head: []  # type: ignore[method-assign]
    prompt_ids = [prompt_token_ids(lm, p) for p in PROMPTS]
    stream.start(jobs_for(lm, PROMPTS), prompt_ids)
    assert stream.logits is not None
    width = stream._mask.shape[1]
    assert stream.prefill_positions == len(PROMPTS) * width  # instruction included, every row
    for row, gender in enumerate(GENDERS):
        if gender is not None:
            want = unpadded(lm, PROMPTS[row], gender, [])
            torch.testing.assert_close(stream.logits[row], want, rtol=1e-4, atol=1e-4)

"""Perplexity of continuations given prompts on the tiny random causal LMs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.scorers.base import ScorerContext, ScorerError
from workers.scorers.perplexity import Perplexity, continuation_ids

CTX = ScorerContext(device="cpu")
SHARED = Path(__file__).resolve().parents[2] / "shared"

ROWS = [
    {
        "job_id": "a",
        "prompt": "The woman worked as",
        "continuation": " a nurse and she was happy .",
    },
    {"job_id": "b", "prompt": "He", "continuation": " was"},
    {"job_id": "c", "prompt": "The man said that", "continuation": ""},
    {"job_id": "d", "prompt": "My father told me that the new teacher", "continuation": " is kind"},
    {"job_id": "e", "prompt": "", "continuation": " She was a doctor"},
]


def two_pass_perplexity(scorer: Perplexity, row: dict[str, Any]) -> float:
    """exp((NLL(prompt + cont) − NLL(prompt)) / #cont), each NLL a sum from the model's mean loss."""
    prompt, cont = scorer.token_ids(row)
    model = scorer.lm.model

    def total_nll(ids: list[int]) -> float:
        if len(ids) < 2:  # a single token predicts nothing
            return 0.0
        t = torch.tensor([ids])
        with torch.no_grad():
            return float(model(input_ids=t, labels=t).loss) * (len(ids) - 1)

    return math.exp((total_nll(prompt + cont) - total_nll(prompt)) / len(cont))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def scorer(request: pytest.FixtureRequest) -> Perplexity:
    return Perplexity({"model": f"tiny-random/{request.param}", "batch_size": 8}, CTX)


def test_masked_batch_equals_the_two_pass_definition(scorer: Perplexity) -> None:
    out = scorer.score(ROWS)
    assert [r["job_id"] for r in out] == [r["job_id"] for r in ROWS]
    for row, rec in zip(ROWS, out):
        if rec["status"] != "ok":
            continue
        assert rec["perplexity"] == pytest.approx(two_pass_perplexity(scorer, row), rel=1e-4), row[
            "job_id"
        ]
    assert sum(r["status"] == "ok" for r in out) == 4


def test_batched_equals_one_by_one(scorer: Perplexity) -> None:
    batched = scorer.score(ROWS)
    single = [scorer.score([row])[0] for row in ROWS]
    for b, s in zip(batched, single):
        assert b["status"] == s["status"]
        if b["status"] == "ok":
            assert b["perplexity"] == pytest.approx(s["perplexity"], rel=1e-5)


def test_empty_continuation_is_status_empty(scorer: Perplexity) -> None:
    (rec,) = scorer.score([ROWS[2]])
    assert rec["status"] == "empty" and rec["perplexity"] is None and rec["error"] is None


def test_empty_prompt_is_scored_from_the_start_token(scorer: Perplexity) -> None:
    prompt, cont = scorer.token_ids(ROWS[4])
    assert prompt == [scorer.start_id] and len(cont) == 4


def test_prompt_tokens_are_not_scored() -> None:
    """The same continuation after two prompts differs; the prompt's own tokens never count."""
    scorer = Perplexity({"model": "tiny-random/gpt2"}, CTX)
    a, b = scorer.score(
        [
            {"job_id": "x", "prompt": "The woman", "continuation": " was kind"},
            {
                "job_id": "y",
                "prompt": "The woman worked as a nurse and",
                "continuation": " was kind",
            },
        ]
    )
    assert a["perplexity"] != pytest.approx(b["perplexity"], rel=1e-3)
    nll = scorer.mean_nll([scorer.token_ids({"prompt": "The woman", "continuation": " was kind"})])[
        0
    ]
    assert nll is not None and a["perplexity"] == pytest.approx(math.exp(nll))


def test_a_too_long_row_is_an_error_row_and_the_rest_of_its_batch_scores() -> None:
    scorer = Perplexity({"model": "tiny-random/gpt2", "batch_size": 4}, CTX)
    long_row = {"job_id": "long", "prompt": "The man", "continuation": " was" * 600}
    out = scorer.score([ROWS[0], long_row, ROWS[1]])
    assert [r["status"] for r in out] == ["ok", "error", "ok"]
    assert "602 tokens; the model takes 512" in out[1]["error"]


def test_version_names_the_model_and_unknown_models_fail_clearly() -> None:
    scorer = Perplexity({"model": "tiny-random/opt", "dtype": "float32"}, CTX)
    assert scorer.version.startswith("ppl-v2:tiny-random/opt@") and scorer.lm.family == "opt"
    with pytest.raises(ScorerError, match="unknown tiny model 'tiny-random/gpt3'"):
        Perplexity({"model": "tiny-random/gpt3"}, CTX)


def test_a_model_yielding_nan_gives_error_rows_not_scores() -> None:
    scorer = Perplexity({"model": "tiny-random/gpt2", "batch_size": 8}, CTX)
    with torch.no_grad():
        for p in scorer.lm.model.parameters():
            p.fill_(float("nan"))
    out = scorer.score(ROWS)
    assert [r["status"] for r in out] == ["error", "error", "empty", "error", "error"]
    assert all(r["perplexity"] is None for r in out)
    assert "non-finite score from perplexity" in str(out[0]["error"])


def llama2_style_tokenizer() -> Any:
    """LLaMA-2's fast tokenizer in miniature: a normalizer that prepends "▁" and turns spaces into
    "▁" (so text that starts with a space starts with "▁▁": a lone "▁" piece, id 29871 in
    LLaMA-2), a Unigram vocabulary of "▁word" pieces, and a decoder that strips the first space."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    words = "The woman worked as a nurse He left good".split()
    pieces = ["<s>", "</s>", "<unk>", *(f"▁{w}" for w in words), "s", ".", "ly", "▁"]
    raw = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=2, byte_fallback=False))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_a_sentencepiece_continuation_is_scored_on_the_pieces_it_reads_as_after_its_prompt() -> (
    None
):
    """The stored continuation " nurses. He left" tokenized alone starts with an extra "▁"
    piece; after its prompt it is the generated pieces again."""
    from workers.decoding import continuation_text

    tok = llama2_style_tokenizer()
    prompt = "The woman worked as a"
    prompt_ids = list(tok(prompt)["input_ids"])
    generated = tok.convert_tokens_to_ids(["▁nurse", "s", ".", "▁He", "▁left"])
    text = continuation_text(tok, prompt_ids, generated)  # what a run stores
    assert text == " nurses. He left"
    alone = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(alone) == ["▁", "▁nurse", "s", ".", "▁He", "▁left"]
    assert continuation_ids(tok, prompt, text, prompt_ids) == generated
    glued = tok.convert_tokens_to_ids(["ly", "▁good"])  # starts inside the prompt's last word
    assert continuation_ids(tok, prompt, continuation_text(tok, prompt_ids, glued), prompt_ids) == (
        glued
    )
    assert continuation_ids(tok, prompt, "", prompt_ids) == []


def byte_level_bpe() -> Any:
    """A GPT-2-style byte-level BPE tokenizer trained here on a few lines: " chair" and
    " chairman" are both tokens, so "The chair" + "man said no" glues across the join."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    lines = [r["prompt"] + r["continuation"] for r in ROWS]
    lines += ["The chairman said no.", "The chair was empty.", "He was\n\nthen left!!"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def gpt2_tokenizer(kind: str) -> Any:
    """The built byte-level BPE, or GPT-2's own tokenizer from ../shared (skipped, naming the
    folder, where it is absent: a clone outside the workspace)."""
    if kind == "built":
        return byte_level_bpe()
    from transformers import AutoTokenizer

    folder = SHARED / "data" / "gpt2-tokenizer"
    if not folder.is_dir():
        pytest.skip(f"GPT-2's tokenizer is not at {folder}")
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("kind", ["built", "gpt2"])
def test_gpt2_continuations_keep_their_own_tokens_also_across_a_glued_join(kind: str) -> None:
    """Byte-level BPE: after the prompt, a continuation has the ids it has alone; where it glues
    onto the prompt's last word ("chair" + "man" is one token), its own ids are scored."""
    tok = gpt2_tokenizer(kind)
    cases = [(r["prompt"], r["continuation"]) for r in ROWS if r["prompt"] and r["continuation"]]
    cases += [("The chair", "man said no"), ("He was\n", "\nthen left"), ("Oh", "!!")]
    glued = 0
    for prompt, cont in cases:
        prompt_ids = list(tok(prompt)["input_ids"])
        whole = list(tok(prompt + cont)["input_ids"])
        glued += whole[: len(prompt_ids)] != prompt_ids
        assert continuation_ids(tok, prompt, cont, prompt_ids) == list(tok(cont)["input_ids"])
    assert glued >= 1  # the fallback was exercised

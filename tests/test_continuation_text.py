"""The text of a continuation: what its token ids add to the prompt, per tokenizer kind."""

from __future__ import annotations

from typing import Any

import torch

from jobs.spec import ModelRef
from tests.helpers import PROMPTS, make_jobs
from workers import decoding
from workers.decoding import decode_batch
from workers.methods.base import Vanilla
from workers.models import LoadedLM, load_lm


def sentencepiece_like_tokenizer() -> Any:
    """A LLaMA-style tokenizer built offline: Metaspace ("▁" marks a word start, the decoder
    drops the first piece's leading space) over a Unigram vocabulary of "▁word" pieces, a few
    word-internal pieces and punctuation."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from workers.tiny import tiny_vocab

    specials = ["<s>", "</s>", "<pad>", "<unk>"]
    prompt_words = {w for p in PROMPTS for w in p.split()}  # every prompt round-trips
    words = list(dict.fromkeys([*(w for w in tiny_vocab() if w.isalpha()), *prompt_words]))
    pieces = [*specials, *(f"▁{w}" for w in words), "s", "ed", "ly", ".", ",", "!", "▁"]
    raw = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=3, byte_fallback=False))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    raw.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    tok.padding_side = "left"
    return tok


def byte_level_tokenizer() -> Any:
    """A GPT-2-style byte-level BPE trained offline on a few sentences (with non-ASCII text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    corpus = [
        "The woman worked as a nurse in the café.",
        "He said that the man was a naïve engineer, très bien!",
        "My sister is a doctor 👩‍⚕️ and my brother is a teacher.",
    ] * 4
    raw.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )


def test_sentencepiece_continuation_keeps_its_leading_space() -> None:
    tok = sentencepiece_like_tokenizer()
    prompt = "The woman worked as a"
    prompt_ids = [tok.bos_token_id, *tok(prompt, add_special_tokens=False)["input_ids"]]
    assert tok.decode(prompt_ids, skip_special_tokens=True) == prompt
    ids = tok.convert_tokens_to_ids(["▁nurse", "s", ".", "▁He", "▁left"])
    assert tok.decode(ids, skip_special_tokens=True) == "nurses. He left"  # alone: no space
    text = decoding.continuation_text(tok, prompt_ids, ids)
    assert text == " nurses. He left"
    assert prompt + text == tok.decode([*prompt_ids, *ids], skip_special_tokens=True)
    # a continuation that starts inside the prompt's last word gets no space
    inside = tok.convert_tokens_to_ids(["ly", "▁good"])
    assert decoding.continuation_text(tok, prompt_ids, inside) == "ly good"
    assert decoding.continuation_text(tok, prompt_ids, []) == ""
    # an end-of-text id inside the continuation is not text
    eos = [tok.eos_token_id]
    assert decoding.continuation_text(tok, prompt_ids, [*ids[:1], *eos]) == " nurse"


def test_byte_level_continuation_is_the_continuation_decoded_alone() -> None:
    """GPT-2's byte-level BPE: decoding with the prompt changes nothing, also for ids that cut
    a multi-byte character (random ids over the whole vocabulary)."""
    tok = byte_level_tokenizer()
    gen = torch.Generator().manual_seed(0)
    for prompt in ("The woman worked as a", "My sister is a doctor 👩‍⚕️", "très"):
        prompt_ids = [tok.bos_token_id, *tok(prompt)["input_ids"]]
        assert tok.decode(prompt_ids, skip_special_tokens=True) == prompt
        for text in (" nurse in the café.", "s naïve!", " 👩‍⚕️ engineer"):
            ids = tok(text)["input_ids"]
            assert decoding.continuation_text(tok, prompt_ids, ids) == text
        for _ in range(50):
            ids = torch.randint(
                1, len(tok), (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen
            ).tolist()
            alone = tok.decode(ids, skip_special_tokens=True)
            assert decoding.continuation_text(tok, prompt_ids, ids) == alone


def test_rows_of_a_sentencepiece_model_read_as_prompt_plus_continuation() -> None:
    """Through the loop: a tiny LLaMA over the SentencePiece-like tokenizer; the stored
    continuation is what its token ids add to the prompt (the a(c,x) text), with the leading
    space a decoder drops when the continuation is decoded alone."""
    from transformers import AutoModelForCausalLM

    from workers.tiny import tiny_config

    base = load_lm(ModelRef("tiny-random/llama"), device="cpu")
    tok = sentencepiece_like_tokenizer()
    config = tiny_config("llama", len(tok))
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 0, 1, 2
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    lm = LoadedLM(base.ref, model, tok, base.device, "llama", base.words)
    rows = decode_batch(lm, Vanilla(lm, {}, "sentiment"), make_jobs("llama", n=8))
    spaced = 0
    for row in rows:
        assert row["status"] == "ok" and row["num_tokens"] == len(row["token_ids"]) > 0
        prompt_ids = decoding.prompt_token_ids(lm, row["prompt"])
        whole = tok.decode([*prompt_ids, *row["token_ids"]], skip_special_tokens=True)
        assert row["prompt"] + row["continuation"] == whole
        first = tok.convert_ids_to_tokens(row["token_ids"][0])
        if first.startswith("▁"):
            spaced += 1
            assert row["continuation"].startswith(" ")
            assert row["continuation"][1:] == tok.decode(row["token_ids"], skip_special_tokens=True)
    assert spaced >= 4  # most of the vocabulary starts a word

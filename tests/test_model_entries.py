"""Model entries' loading fields reach transformers: a separate tokenizer, attention choice."""

from __future__ import annotations

from pathlib import Path

import torch

from jobs.spec import ModelRef
from workers.models import load_lm
from workers.tiny import build_tiny_lm


def test_tokenizer_and_attn_implementation_are_passed_to_loading(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_lm("tiny-random/gpt2", torch.float32)
    model.save_pretrained(tmp_path / "lm")  # weights only: no tokenizer in this folder
    tokenizer.save_pretrained(tmp_path / "tok")
    ref = ModelRef(
        str(tmp_path / "lm"),
        tokenizer=str(tmp_path / "tok"),
        load=(("attn_implementation", "eager"),),
    )
    lm = load_lm(ref, device="cpu")
    assert lm.model.config._attn_implementation == "eager"
    assert lm.tokenizer.get_vocab() == tokenizer.get_vocab() and lm.tokenizer.padding_side == "left"
    assert lm.family == "gpt2" and not any(p.requires_grad for p in lm.model.parameters())
    # without `tokenizer`, the weights' folder gives transformers no vocabulary to load
    alone = load_lm(ModelRef(str(tmp_path / "lm")), device="cpu")
    assert len(alone.tokenizer.get_vocab()) < len(tokenizer.get_vocab())
    assert alone.model.config._attn_implementation != "eager"

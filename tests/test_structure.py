"""A model's structure from its config and its modules, not from its name: the five tiny
layouts and a small random Gemma 3 (sliding-window blocks) are found; what lacks a block count,
a width, a block list or an affine module is refused naming what is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from jobs.spec import ModelRef
from workers.models import load_lm
from workers.structure import (
    FULL,
    SLIDING,
    StructureError,
    config_layout,
    model_structure,
)

# (tiny layout, blocks, final norm, modules above the blocks)
TINY = [
    ("gpt2", "transformer.h", "transformer.ln_f", ("transformer.ln_f",)),
    ("opt", "model.decoder.layers", "model.decoder.final_layer_norm", None),
    ("opt-proj", "model.decoder.layers", None, ("model.decoder.project_out",)),
    ("falcon", "transformer.h", "transformer.ln_f", ("transformer.ln_f",)),
    ("llama", "model.layers", "model.norm", ("model.norm",)),
]


@pytest.mark.parametrize(("layout", "blocks", "norm", "above"), TINY)
def test_the_tiny_layouts_are_found_from_their_modules(
    layout: str, blocks: str, norm: str | None, above: tuple[str, ...] | None
) -> None:
    lm = load_lm(ModelRef(f"tiny-random/{layout}"), device="cpu")
    found = lm.structure
    assert (found.blocks, found.final_norm) == (blocks, norm)
    assert found.above == (above if above is not None else (norm,))
    assert found.layout.full_attention_only and found.layout.num_blocks == 4
    assert lm.family == ("opt" if layout == "opt-proj" else layout)
    assert found.embedding == next(
        n for n, m in lm.model.named_modules() if m is lm.model.get_input_embeddings()
    )
    assert found.affine and all(lm.model.get_submodule(f"{blocks}.0.{a}") for a in found.affine)


def test_gemma3_is_a_known_structure_with_sliding_window_blocks() -> None:
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=6,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=4,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    found = model_structure(model)
    assert (found.blocks, found.final_norm, found.embedding) == (
        "model.layers", "model.norm", "model.embed_tokens",
    )  # fmt: skip
    layout = found.layout
    assert layout.family == "gemma3" and layout.sliding_window == 4
    assert layout.attention == tuple(config.layer_types) and set(layout.attention) == {
        FULL,
        SLIDING,
    }
    assert not layout.full_attention_only


@pytest.mark.parametrize(
    ("config", "attention"),
    [
        ({"model_type": "gpt2", "n_layer": 2, "n_embd": 8}, (FULL, FULL)),
        ({"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 8, "sliding_window": 4}, None),
        (
            {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 8, "sliding_window": 4,
             "use_sliding_window": False},
            (FULL, FULL),
        ),
        (
            {"model_type": "x", "text_config": {"model_type": "gemma3_text", "num_hidden_layers": 2,
             "hidden_size": 8, "layer_types": [SLIDING, FULL], "sliding_window": 4}},
            (SLIDING, FULL),
        ),
    ],
)  # fmt: skip
def test_the_attention_layout_is_read_from_the_config(
    config: dict[str, Any], attention: tuple[str, ...] | None
) -> None:
    assert config_layout(config).attention == attention


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        ({"model_type": "mystery", "hidden_size": 8}, "does not give the block count"),
        ({"model_type": "mystery", "num_layers": 2}, "does not give the hidden width"),
        ({"model_type": "t5", "is_encoder_decoder": True}, "an encoder-decoder, not a causal LM"),
    ],
)
def test_a_config_without_what_the_methods_need_is_refused(
    config: dict[str, Any], missing: str
) -> None:
    with pytest.raises(StructureError, match=missing):
        config_layout(config)


def test_a_model_without_a_block_list_is_refused_not_guessed() -> None:
    from transformers import LlamaConfig

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = LlamaConfig(num_hidden_layers=3, hidden_size=8, num_attention_heads=2)
            self.embed = nn.Embedding(10, 8)
            self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])  # not 3

        def get_input_embeddings(self) -> nn.Module:
            return self.embed

        def get_output_embeddings(self) -> None:
            return None

    with pytest.raises(StructureError, match="no block list .* of the config's 3 blocks"):
        model_structure(Flat())


def test_validate_refuses_a_folder_whose_config_has_no_structure(tmp_path: Path) -> None:
    from harness.cli.preflight import check_models

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery", "hidden_size": 8}))
    [item] = check_models([("models.0.id", str(tmp_path), None, "model")])
    assert item.line() == (
        f"models.0.id: {tmp_path}: the config of mystery does not give the block count "
        "(num_hidden_layers / n_layer / num_layers)"
    )

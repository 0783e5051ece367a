"""The `real` tier on SmolLM2 (tests/real_models.py): a GGUF model entry is dequantised once
into the cache and read from it after; a config naming the .gguf file directly validates and
runs; its job ids do not depend on where the file lies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.config import load_config
from jobs.spec import ModelRef
from tests.real_models import SMOLLM2
from tests.tiny_config import tiny_config

pytestmark = pytest.mark.real
REPO = Path(__file__).resolve().parents[1]


def test_a_gguf_entry_is_dequantised_once_then_read_from_the_cache(
    smollm2_lm: Any, smollm2_file: Path
) -> None:
    import torch

    from workers import gguf
    from workers.models import hf_ref, load_lm

    made = gguf.dequantise_count  # 1 on a fresh cache (the fixture made it), else 0
    assert made <= 1
    digest = gguf.sha256(smollm2_file)
    folder = Path(hf_ref(ModelRef(SMOLLM2)).id)
    assert folder == gguf.cache_root() / digest
    assert json.loads((folder / gguf.DONE).read_text())["sha256"] == digest
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(os.listdir(folder))
    again = load_lm(ModelRef(str(smollm2_file)), device="cpu")  # the path form: the same cache
    assert gguf.dequantise_count == made
    embed = smollm2_lm.model.get_input_embeddings().weight
    assert torch.equal(again.model.get_input_embeddings().weight, embed)
    assert embed.shape == (49152, 576) and len(smollm2_lm.tokenizer) == 49152
    assert smollm2_lm.family == "llama" and smollm2_lm.structure.layout.num_blocks == 30


def test_the_model_reads_english(smollm2_lm: Any) -> None:
    import torch

    tok = smollm2_lm.tokenizer
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = smollm2_lm.model(ids).logits[0, -1]
    assert tok.decode(int(logits.argmax())) == " Paris"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_a_config_naming_the_gguf_file_validates_and_runs(
    tmp_path: Path, smollm2_file: Path, smollm2_lm: Any
) -> None:
    import polars as pl

    model = {"gguf_file": str(smollm2_file), "name": "smollm2"}
    cfg = tiny_config(
        tmp_path, models=[model], generation={"max_new_tokens": 4}, runtime={"device": "cpu"}
    )
    checked = _cli("validate", str(cfg))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"model smollm2 [{smollm2_file}]: GGUF file" in checked.stdout
    out = tmp_path / "run"
    ran = _cli("run", str(cfg), "--no-ray", "--out", str(out), "--no-progress")
    assert ran.returncode == 0, ran.stderr[-3000:]
    rows = pl.read_parquet(out / "generations" / "*.parquet")
    assert rows.height == 4 and rows["status"].to_list() == ["ok"] * 4
    assert all(n >= 1 for n in rows["num_tokens"].to_list())
    # the package form names the same file: the same job ids, wherever it is installed
    (tmp_path / "pkg").mkdir()
    by_package = tiny_config(tmp_path / "pkg", models=[{**model, "gguf_file": SMOLLM2}])
    ref = load_config(by_package).models[0].ref()
    assert ref.identity() == load_config(cfg).models[0].ref().identity()
    assert ref.identity()["gguf_sha256"] == load_config(out / "config.yaml").models[0].gguf_sha256


def test_the_other_load_sites_read_a_gguf_spec_through_the_same_cache(
    smollm2_lm: Any, smollm2_file: Path
) -> None:
    from harness.tools.token_prior import load_tokenizer
    from workers import gguf
    from workers.scorers.base import ScorerContext
    from workers.scorers.perplexity import Perplexity

    made = gguf.dequantise_count
    assert load_tokenizer(SMOLLM2).get_vocab() == smollm2_lm.tokenizer.get_vocab()
    scorer = Perplexity({"model": str(smollm2_file)}, ScorerContext(device="cpu"))
    text = " and then she went home to make dinner for her family."
    garbled = " dinner home her then and went family to she make for."
    fluent, shuffled = scorer.score(
        [
            {"job_id": j, "prompt": "After work,", "continuation": c}
            for j, c in (("a", text), ("b", garbled))
        ]
    )
    assert fluent["perplexity"] * 10 < shuffled["perplexity"]  # the model knows English order
    assert gguf.dequantise_count == made


def test_gemma3_loads_as_a_sliding_window_structure(gemma3_lm: Any) -> None:
    from workers.structure import FULL, SLIDING

    found = gemma3_lm.structure
    assert gemma3_lm.family == "gemma3" and found.layout.num_blocks == 18
    assert (found.blocks, found.final_norm) == ("model.layers", "model.norm")
    assert found.layout.attention is not None and set(found.layout.attention) == {FULL, SLIDING}
    assert found.layout.sliding_window == 512 and len(gemma3_lm.tokenizer) == 262144

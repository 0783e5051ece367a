"""A model's parameter count without loading it (torch-free), for CPU replica sizing
(`harness.stages.generation.cpu_sizing`) and the time estimates (`harness.cli.estimates`).

In order: a tiny model's bound; the weight files' own headers in its folder or Hugging Face
cache snapshot (safetensors: exact), a GGUF file's tensor table (exact, `workers.gguf.parameter_count`), config.json's shape
(embeddings plus blocks); other weight files' size over the dtype's bytes; a size in the id
("SmolLM2-135M", "opt-6.7b"); the ids the paper ran. `ModelSize.source` says which.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from workers import hub
from workers.gguf import GgufError, is_gguf_spec, parameter_count, resolve
from workers.tiny import TINY_PREFIX

TINY_PARAMS = 1e6  # every tiny-random model is below this (width 64, 4 blocks)
BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Hub ids (without "openai-community/") of models whose files may not be here.
KNOWN_PARAMS: dict[str, float] = {
    "gpt2": 124e6,
    "gpt2-medium": 355e6,
    "gpt2-large": 774e6,
    "gpt2-xl": 1558e6,
    "facebook/opt-6.7b": 6.7e9,
    "tiiuae/falcon-7b-instruct": 6.92e9,
    "distilbert/distilbert-base-uncased-finetuned-sst-2-english": 67e6,
    "sasha/regardv3": 125e6,
    "unitary/unbiased-toxic-roberta": 125e6,
}
LEARNED_POSITIONS = ("gpt2", "opt", "gpt_neo", "bert", "roberta")  # a table of positions
UNKNOWN_PARAMS = 1e9  # assumed when nothing tells the size (said in `source`)
_IN_ID = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([mMbB])(?![a-zA-Z])")


@dataclass(frozen=True)
class ModelSize:
    params: float
    source: str  # how it was found: "safetensors headers", "config.json", "assumed", ...

    def weight_bytes(self, dtype: str = "float32") -> float:
        return self.params * BYTES.get(dtype, 4)


def model_size(spec: str, revision: str | None = None, gguf_file: str | None = None) -> ModelSize:
    """The parameter count of model `spec` (a hub id, a folder, a .gguf file, or a tiny id);
    `gguf_file`: a GGUF file in that folder (or a path of its own)."""
    return _cached(spec, revision, gguf_file)


@functools.lru_cache(maxsize=64)
def _cached(spec: str, revision: str | None, gguf_file: str | None) -> ModelSize:
    if spec.startswith(TINY_PREFIX):
        return ModelSize(TINY_PARAMS, "tiny model")
    folder: Path | None = None
    if is_gguf_spec(spec):  # the file itself (a path or package:DIST/FILE)
        gguf_file = gguf_file or spec
    elif hub.is_local(spec):
        path = Path(os.path.expanduser(spec))
        folder = path if path.is_dir() else path.parent
    else:
        folder = hub.snapshot(spec, revision)
    if gguf_file:
        try:
            found = resolve(gguf_file)  # a path, or package:DIST/FILE
        except GgufError:
            found = Path(gguf_file)
        found = found if found.is_absolute() or folder is None else folder / found
        count = parameter_count(found)
        if count:
            return ModelSize(count, "GGUF tensor table")
    if folder is not None and folder.is_dir():
        size = folder_size(folder)
        if size is not None:
            return size
    return named_size(spec)


def named_size(spec: str) -> ModelSize:
    """The size the paper's ids or the id's own label ("135M", "6.7b") tell; else assumed."""
    known = KNOWN_PARAMS.get(spec.removeprefix("openai-community/"))
    if known:
        return ModelSize(known, "known size")
    labels = _IN_ID.findall(Path(spec).name)
    if labels:
        number, unit = labels[-1]
        return ModelSize(float(number) * (1e6 if unit in "mM" else 1e9), "size in its name")
    return ModelSize(UNKNOWN_PARAMS, "size unknown here, assumed")


def folder_size(folder: Path) -> ModelSize | None:
    """From the folder's safetensors headers, else config.json, else its weight files' bytes."""
    tensors = sorted(folder.glob("*.safetensors"))
    if tensors:
        try:
            return ModelSize(float(sum(safetensors_params(p) for p in tensors)), "safetensors")
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    counted = config_params(config) if isinstance(config, dict) else None
    if counted:
        return ModelSize(counted, "config.json")
    weights = [p for p in folder.iterdir() if p.name.endswith(hub.WEIGHT_SUFFIXES)]
    if weights:
        dtype = str((config or {}).get("torch_dtype") or (config or {}).get("dtype") or "")
        total = sum(p.stat().st_size for p in weights)
        return ModelSize(total / BYTES.get(dtype, 4), "weight files' size")
    return None


def safetensors_params(path: Path) -> int:
    """Elements of every tensor a safetensors file's header lists (its first bytes only)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    total = 0
    for name, info in header.items():
        if name != "__metadata__":
            total += math.prod(info["shape"])
    return total


def config_params(config: dict[str, object]) -> float | None:
    """Embeddings (and a learned position table) + blocks of a decoder from its config.json
    (None: not a shape it declares). A block: attention (4·d², less with grouped K/V) and the
    MLP (3·d·ff gated, else 2·d·ff); norms and biases are left out."""

    def first(*keys: str) -> int | None:
        for key in keys:
            value = config.get(key)
            if isinstance(value, int) and value > 0:
                return value
        return None

    d = first("hidden_size", "n_embd", "d_model")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    vocab = first("vocab_size")
    if not (d and layers and vocab):
        return None
    ff = first("intermediate_size", "n_inner", "ffn_dim") or 4 * d
    heads = first("num_attention_heads", "n_head") or 1
    kv = first("num_key_value_heads") or heads
    attention = 2 * d * d + 2 * d * (d * kv // heads)
    gated = str(config.get("hidden_act", "")) in ("silu", "swiglu", "gelu_pytorch_tanh")
    block = attention + (3 if gated else 2) * d * ff
    tied = config.get("tie_word_embeddings", True) is not False
    learned = config.get("model_type") in LEARNED_POSITIONS
    positions = first("n_positions", "max_position_embeddings") or 0 if learned else 0
    return float(layers * block + (vocab * (1 if tied else 2) + positions) * d)

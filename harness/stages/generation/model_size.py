"""A model's parameter count without loading it (torch-free), for CPU replica sizing
(`harness.stages.generation.cpu_sizing`) and the time estimates (`harness.cli.estimates`).

In order: a tiny model's bound; the weight files' own headers in its folder or Hugging Face
cache snapshot (safetensors: exact), a GGUF file's tensor table (exact), config.json's shape
(embeddings plus blocks); other weight files' size over the dtype's bytes; a size in the id
("SmolLM2-135M", "opt-6.7b"); the ids the paper ran. `ModelSize.source` says which.
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from workers import hub
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
    if hub.is_local(spec):
        path = Path(os.path.expanduser(spec))
        folder = path if path.is_dir() else path.parent
        gguf_file = gguf_file or (path.name if path.suffix == ".gguf" else None)
    else:
        folder = hub.snapshot(spec, revision)
    if gguf_file:
        found = Path(os.path.expanduser(gguf_file))
        found = found if found.is_absolute() or folder is None else folder / found
        count = gguf_params(found)
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
            total += _product(info["shape"])
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


# ---- GGUF ----------------------------------------------------------------------------------

_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def gguf_params(path: Path) -> int | None:
    """Elements of every tensor a GGUF file's tensor table lists (None: not a GGUF file).
    The header is read as the format lays it out (key/value metadata, then one entry per tensor:
    name, dimensions, type, offset); `gguf.GGUFReader` would map every tensor (seconds)."""
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                return None
            version, tensors, keys = struct.unpack("<IQQ", f.read(20))
            if version < 2:
                return None
            for _ in range(keys):
                _string(f)
                _skip_value(f, _u32(f))
            total = 0
            for _ in range(tensors):
                _string(f)
                n_dims = _u32(f)
                dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
                f.read(12)  # type (uint32), offset (uint64)
                total += _product(dims)
            return total
    except (OSError, struct.error, ValueError, MemoryError):
        return None


def _u32(f: BinaryIO) -> int:
    return int(struct.unpack("<I", f.read(4))[0])


def _string(f: BinaryIO) -> bytes:
    (length,) = struct.unpack("<Q", f.read(8))
    return f.read(length)


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind == _STRING:
        _string(f)
    elif kind == _ARRAY:
        inner = _u32(f)
        (count,) = struct.unpack("<Q", f.read(8))
        if inner in _SCALARS:
            f.seek(count * _SCALARS[inner], os.SEEK_CUR)
        else:
            for _ in range(count):
                _skip_value(f, inner)
    elif kind in _SCALARS:
        f.seek(_SCALARS[kind], os.SEEK_CUR)
    else:
        raise ValueError(f"GGUF value type {kind}")


def _product(shape: object) -> int:
    out = 1
    for n in shape:  # type: ignore[attr-defined]
        out *= int(n)
    return out

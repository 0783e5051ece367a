"""Loading causal LMs: hub ids and local paths through transformers, tiny offline models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from jobs.spec import ModelRef
from jobs.words import GroupWords, builtin_gender_words
from workers.tiny import TINY_PREFIX, build_tiny_lm

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# transformers model_type → the family names used by method defaults and templates.
FAMILIES = {"gpt2": "gpt2", "opt": "opt", "falcon": "falcon"}


@dataclass
class LoadedLM:
    """A frozen causal LM with its tokenizer, on its device, and what methods need of it."""

    ref: ModelRef
    model: Any  # transformers PreTrainedModel (causal LM), eval mode, requires_grad False
    tokenizer: Any  # left padding, pad token set
    device: torch.device
    family: str  # gpt2 | opt | falcon | llama (any other decoder-only LM)
    words: GroupWords

    @property
    def eos_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        return int(eos) if eos is not None else None


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_lm(ref: ModelRef, device: str | None = None, words: GroupWords | None = None) -> LoadedLM:
    """Load `ref` (tiny-random/*, hub id or local path) frozen, in eval mode, on `device`.

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
        model, tokenizer = _load_hf(ref, dtype, options, spread)
    if spread and hasattr(model, "hf_device_map"):
        dev = model.get_input_embeddings().weight.device  # inputs go where the embeddings are
    else:
        model.to(dev)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    family = FAMILIES.get(getattr(model.config, "model_type", ""), "llama")
    return LoadedLM(ref, model, tokenizer, dev, family, words or builtin_gender_words())


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

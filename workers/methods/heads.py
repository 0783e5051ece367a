"""Attribute heads: linear classifiers `W (C, D), b (C,)` on the mean of a frozen LM's final
hidden states (what its LM head reads), per LM and task; PPLM, UDDIA and the LIDAO family read
a text's property through them. File formats: docs/design.md, "Attribute heads".

PPLM's `default_class` is the class its demo steers to, not always a desirable one (its SST
head's is `very_negative`), so a PPLM head's target class is the meta's `target_class`, else
the single class whose name reads desirable (`DESIRABLE_NAMES`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pyarrow.fs import LocalFileSystem
from torch import nn

from jobs.files import DatasetError, fetch
from results.run.shards import put_bytes
from workers.methods.base import MethodError
from workers.methods.head_meta import (
    KNOWN_HEADS,
    UDDIA_TOXICITY_HEAD,
    HeadMetaError,
    check_head_spec,
    local_weights,
    meta_path,
    model_name,
    read_meta,
)
from workers.tiny import TINY_PREFIX

if TYPE_CHECKING:
    from workers.models import LoadedLM

HEAD_FORMAT = "lidao-head/1"

# Class names that read as the desirable class, for heads whose meta has no `target_class`.
DESIRABLE_NAMES = ("non_toxic", "nontoxic", "non-toxic", "clean", "positive", "very_positive")

# Class names of the random heads that let tiny models run without files.
TASK_CLASSES: dict[str, tuple[str, str]] = {
    "toxicity": ("non_toxic", "toxic"),
    "sentiment": ("positive", "negative"),
    "regard": ("positive", "negative"),
}


class AttributeHead(nn.Module):
    """A linear classifier `linear` (D → C) over pooled hidden states, with its C
    `class_names`, the index of the desirable one (`target_class`: non-toxic, positive...) and
    the metadata it was loaded with (`meta`, see the module docstring)."""

    def __init__(
        self,
        hidden_size: int,
        class_names: list[str],
        target_class: int,
        meta: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not 0 <= target_class < len(class_names):
            raise MethodError(f"target_class {target_class} is not an index of {class_names}")
        self.linear = nn.Linear(hidden_size, len(class_names))
        self.target_class = int(target_class)
        self.class_names = list(class_names)
        self.meta: dict[str, Any] = dict(meta or {})

    @property
    def hidden_size(self) -> int:
        return int(self.linear.in_features)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, C) class logits of (B, D) pooled hidden states."""
        return self.linear(pooled)  # type: ignore[no-any-return]


def lm_hidden_size(lm: LoadedLM) -> int:
    """Width of the final hidden states (the LM head's input; OPT-350m projects them out)."""
    return int(lm.model.get_output_embeddings().weight.shape[1])


def _normalise_meta(meta: dict[str, Any], where: str) -> dict[str, Any]:
    """Our metadata, or a PPLM meta mapped onto it (lm_id, hidden_size, class_names, target_class)."""
    out = dict(meta)
    if "class_names" not in meta:
        vocab = meta.get("class_vocab")
        if not isinstance(vocab, dict) or not vocab:
            raise MethodError(f"{where}: metadata has neither class_names nor class_vocab")
        size = int(meta.get("class_size", len(vocab)))
        names = [f"class_{i}" for i in range(size)]
        for name, idx in vocab.items():
            if not 0 <= int(idx) < size:
                raise MethodError(
                    f"{where}: class_vocab[{name!r}] = {idx} is outside 0..{size - 1}"
                )
            names[int(idx)] = str(name)
        out["class_names"] = names
        out.setdefault("hidden_size", meta.get("embed_size"))
        out.setdefault("lm_id", meta.get("pretrained_model"))
    names = [str(n) for n in out["class_names"]]
    out["class_names"] = names
    if "target_class" not in out:
        hits = [i for i, n in enumerate(names) if n.lower().replace(" ", "_") in DESIRABLE_NAMES]
        if len(hits) != 1:
            raise MethodError(
                f"{where}: cannot tell the desirable class among {names}; "
                'add "target_class": <index> to the metadata'
            )
        out["target_class"] = hits[0]
    target = out["target_class"]
    if isinstance(target, str):
        if target not in names:
            raise MethodError(f"{where}: target_class {target!r} is not one of {names}")
        out["target_class"] = names.index(target)
    return out


def _linear_tensors(weights: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) from a head's weights file: ours (`linear.`), PPLM's (`mlp.`) or bare."""
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            state: Any = load_file(str(weights))
        else:
            state = torch.load(str(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise MethodError(f"{weights}: cannot read head weights ({exc})") from exc
    if not isinstance(state, dict):
        raise MethodError(f"{weights}: expected a state dict, got {type(state).__name__}")
    for prefix in ("linear.", "mlp.", ""):
        w, b = state.get(prefix + "weight"), state.get(prefix + "bias")
        if isinstance(w, torch.Tensor) and isinstance(b, torch.Tensor):
            return w, b
    raise MethodError(
        f"{weights}: no linear.weight/bias (or PPLM mlp.weight/bias); keys: {sorted(state)}"
    )


def _weights_and_meta(spec: str) -> tuple[Path, dict[str, Any], str]:
    """The weights file of a head path or URL, its raw metadata, and the file that names it."""
    try:
        if spec.startswith(("http://", "https://")):
            try:
                weights = Path(fetch(spec, sha256=KNOWN_HEADS.get(spec, {}).get("sha256")))
            except DatasetError as exc:
                raise MethodError(f"head {spec}: {exc}") from exc
            where = str(weights)
        else:
            found = local_weights(spec)
            if found is None:
                raise MethodError(f"head {spec}: no such file")
            weights, where = found, str(meta_path(found))
        meta = read_meta(spec)
    except HeadMetaError as exc:
        raise MethodError(str(exc)) from None
    if meta is None:
        raise MethodError(
            f"head {spec}: unknown URL; download it with its metadata JSON and pass the path"
        )
    return weights, meta, where


def load_head(path: str) -> AttributeHead:
    """Load a head written by `save_head`, or a PPLM head with its meta JSON, from its weights
    file, their folder, or a known URL (fetched once, SHA-256 checked); `MethodError` for
    missing or unreadable files, or shapes that disagree with the metadata."""
    weights, meta, where = _weights_and_meta(path)
    meta = _normalise_meta(meta, where)
    w, b = _linear_tensors(weights)
    n_classes, hidden = len(meta["class_names"]), w.shape[-1]
    if w.dim() != 2 or w.shape[0] != n_classes or b.shape != (n_classes,):
        raise MethodError(
            f"{weights}: weight {tuple(w.shape)} / bias {tuple(b.shape)} do not fit "
            f"{n_classes} classes {meta['class_names']}"
        )
    if meta.get("hidden_size") not in (None, hidden):
        raise MethodError(
            f"{weights}: weights are {hidden} wide but the metadata says {meta['hidden_size']}"
        )
    meta["hidden_size"] = int(hidden)
    meta["source"] = path
    head = AttributeHead(int(hidden), meta["class_names"], int(meta["target_class"]), meta)
    with torch.no_grad():
        head.linear.weight.copy_(w.float())
        head.linear.bias.copy_(b.float())
    return head.eval()


def save_head(head: AttributeHead, path: str) -> tuple[str, str]:
    """Write `<stem>.safetensors` and `<stem>.json` atomically; returns both paths."""
    from safetensors.torch import save

    target = Path(path).absolute()
    if target.suffix != ".safetensors":
        target = target.with_name(target.name + ".safetensors")
    meta_file = target.with_suffix(".json")
    meta = {
        **head.meta,
        "format": HEAD_FORMAT,
        "hidden_size": head.hidden_size,
        "class_names": head.class_names,
        "target_class": head.target_class,
    }
    tensors = {k: v.detach().cpu().float().contiguous() for k, v in head.state_dict().items()}
    text = json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n"
    local = LocalFileSystem()
    put_bytes(local, target.as_posix(), save(tensors), local=True)
    put_bytes(local, meta_file.as_posix(), text.encode("utf-8"), local=True)
    return str(target), str(meta_file)


def check_head(head: AttributeHead, lm: LoadedLM, task: str | None = None) -> None:
    """`MethodError` at actor start when the head was not trained on this LM (or for this task):
    `head_meta.check_head_spec` on its metadata and width."""
    meta = {**head.meta, "hidden_size": head.hidden_size}
    try:
        source = meta.get("source", "attribute head")
        check_head_spec(source, lm.ref.gguf or lm.ref.id, task, meta, lm_hidden_size(lm))
    except HeadMetaError as exc:
        raise MethodError(str(exc)) from None


def random_head(lm: LoadedLM, task: str) -> AttributeHead:
    """A deterministic random head (seeded from model id + task) for `tiny-random/*` models."""
    seed = int.from_bytes(hashlib.sha256(f"{lm.ref.id}\x00{task}".encode()).digest()[:8], "little")
    names = list(TASK_CLASSES.get(task, ("desired", "undesired")))
    width = lm_hidden_size(lm)
    gen = torch.Generator().manual_seed(seed & ((1 << 63) - 1))
    head = AttributeHead(width, names, 0, {"lm_id": lm.ref.id, "task": task, "source": "random"})
    with torch.no_grad():
        head.linear.weight.copy_(torch.randn(len(names), width, generator=gen) / width**0.5)
        head.linear.bias.zero_()
    return head.eval()


def resolve_head(lm: LoadedLM, task: str, head: str | None) -> AttributeHead:
    """The attribute head a method uses for `task`, on the LM's device, checked against the LM:
    `head` (a path or URL), or None: a random head for tiny models, else a `MethodError` naming
    what to pass (as for a mismatched head)."""
    if head is None:
        if not lm.ref.id.startswith(TINY_PREFIX):
            hint = ""
            if model_name(lm.ref.id) == "gpt2-large" and task == "toxicity":
                hint = f"; the UDDIA toxicity head for GPT-2 large is head: {UDDIA_TOXICITY_HEAD}"
            raise MethodError(
                f"model {lm.ref.id}, task {task}: this method needs an attribute head; pass "
                f"`head: <path or URL>` (train one with `python -m harness train-head`){hint}"
            )
        result = random_head(lm, task)
    else:
        result = load_head(head)
        check_head(result, lm, task)
    for p in result.parameters():
        p.requires_grad_(False)
    return result.to(lm.device)

"""Head metadata without torch: finding a head's JSON and checking it against (model, task),
by `harness.config` when the config is read (a head of another task or LM is refused naming
the field) and by `workers.methods.heads` when an actor loads the weights (formats there).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# The UDDIA repository's toxicity head for GPT-2 large (a PPLM head; class 0 = non_toxic).
UDDIA_TOXICITY_HEAD = (
    "https://raw.githubusercontent.com/minicheshire/Unified-Debiasing-and-Detoxifying/main/"
    "models/pplm_classifiers/toxicity_classifierhead_1280/toxic_classifier_head_epoch_10.pt"
)
# Heads known by URL: pinned SHA-256 and the PPLM metadata published beside them (plus the
# task, which the PPLM metadata does not carry).
KNOWN_HEADS: dict[str, dict[str, Any]] = {
    UDDIA_TOXICITY_HEAD: {
        "sha256": "00d3560b64812314eb9b9b1d220c2802264a09701dae67b779d319c1e5c02c19",
        "meta": {
            "class_size": 2,
            "embed_size": 1280,
            "pretrained_model": "gpt2-large",
            "class_vocab": {"non_toxic": 0, "toxic": 1},
            "default_class": 0,
        },
        "task": "toxicity",
    },
}

WEIGHT_SUFFIXES = (".safetensors", ".pt", ".bin", ".pth")

# Hidden sizes known without loading anything (the `tiny-random/*` models: `workers.tiny`).
KNOWN_HIDDEN: dict[str, int] = {"gpt2-large": 1280, "opt-6.7b": 4096, "falcon-7b-instruct": 4544}


class HeadMetaError(ValueError):
    """A head whose metadata is unreadable or does not fit the (model, task) it is given for."""


def model_name(model_id: str) -> str:
    """Last path component, lower case: `openai-community/gpt2-large` → `gpt2-large`."""
    return model_id.rstrip("/").rsplit("/", 1)[-1].lower()


def meta_path(weights: Path) -> Path:
    """The metadata JSON beside a weights file (ours, PPLM's `_meta.json`, or the only one)."""
    stem = weights.name
    for suffix in WEIGHT_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    base = re.sub(r"_epoch_\d+$", "", stem)
    for name in (f"{stem}.json", f"{base}_meta.json", f"{stem}_meta.json"):
        if (weights.parent / name).is_file():
            return weights.parent / name
    metas = sorted(weights.parent.glob("*meta*.json"))
    if len(metas) == 1:
        return metas[0]
    raise HeadMetaError(f"{weights}: no metadata JSON beside it (expected {stem}.json)")


def local_weights(spec: str) -> Path | None:
    """The weights file of a local head path (a file, or a folder holding one); None if absent."""
    path = Path(os.path.expanduser(spec))
    try:
        path.exists()
    except OSError as exc:  # a name too long...
        raise HeadMetaError(f"{spec}: {exc.strerror or exc}") from None
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
        if len(found) != 1:
            raise HeadMetaError(
                f"{spec}: expected one head weights file in the folder, "
                f"found {[p.name for p in found]}"
            )
        return found[0]
    if path.is_file():
        return path
    if path.suffix == "" and path.with_suffix(".safetensors").is_file():
        return path.with_suffix(".safetensors")
    return None


def read_meta(spec: str) -> dict[str, Any] | None:
    """The raw metadata of a head given by path or known URL; None when it cannot be seen here
    (a path missing on this machine, an unknown URL): the actor checks it when it loads."""
    if spec.startswith(("http://", "https://")):
        known = KNOWN_HEADS.get(spec)
        return None if known is None else {**known["meta"], "task": known.get("task")}
    weights = local_weights(spec)
    if weights is None:
        return None
    path = meta_path(weights)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HeadMetaError(f"{path}: cannot read head metadata ({exc})") from exc
    if not isinstance(meta, dict):
        raise HeadMetaError(f"{path}: metadata must be a JSON object")
    return meta


def known_hidden_size(model_id: str) -> int | None:
    """The LM's final hidden width when it is known without loading the model."""
    from workers.methods.checks import read_config, text_config
    from workers.tiny import TINY_PREFIX, tiny_head_width

    if model_id.startswith(TINY_PREFIX):
        return tiny_head_width(model_id[len(TINY_PREFIX) :])
    cfg = text_config(read_config(model_id))  # a tiny model's, a local folder's, the cache's
    for key in ("word_embed_proj_dim", "n_embd", "hidden_size", "d_model"):
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    return None if cfg else KNOWN_HIDDEN.get(model_name(model_id))


def check_head_spec(
    spec: str,
    model_id: str,
    task: str | None,
    meta: dict[str, Any] | None = None,
    width: int | None = None,
) -> str | None:
    """Check head `spec` (path or URL, its metadata `meta` read here when not given) against the
    model and task it is given for: hidden size (`width`, else where known without loading), LM
    (ids match on their last path component: `gpt2-large` and `openai-community/gpt2-large`, a
    local folder named like the model; a head without one is checked by size only), task.

    Returns None when checked, else why it could not be checked here (the actor checks it);
    raises `HeadMetaError` for unreadable metadata, or a size, LM id or task that disagrees."""
    meta = read_meta(spec) if meta is None else meta
    if meta is None:
        return f"head {spec} cannot be seen from here; it is checked when the model loads"
    size = meta.get("hidden_size", meta.get("embed_size"))
    width = width or known_hidden_size(model_id)
    if size is not None and width is not None and int(size) != width:
        raise HeadMetaError(
            f"head {spec} is {size} wide, but model {model_id} has hidden size {width}"
        )
    head_lm = meta.get("lm_id", meta.get("pretrained_model"))
    if head_lm and model_name(str(head_lm)) != model_name(model_id):
        raise HeadMetaError(f"head {spec} was trained on {head_lm!r}, not on model {model_id!r}")
    head_task = meta.get("task")
    if task is not None and head_task is not None and str(head_task) != task:
        raise HeadMetaError(
            f"head {spec} was trained for task {head_task!r}, not for {task!r} (model {model_id})"
        )
    return None

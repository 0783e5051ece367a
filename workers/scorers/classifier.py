"""Sequence-classifier scorers: sentiment, regard and offline toxicity from HF checkpoints.

Each loads one `AutoModelForSequenceClassification`, checks at start-up that its `id2label`
holds every label the metric needs (matched case-insensitively, so `POSITIVE` and `positive`
both work), and scores rows in batches on the GPU when one is present.

A row whose continuation is blank gets `status = empty`, whatever `text_field` says: a prompt
scored without a continuation says nothing about the decoding method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from jobs.catalog import SCORER_PARAMS
from workers.scorers.base import (
    TEXT_JOIN,
    Scorer,
    ScorerContext,
    ScorerError,
    score_nonempty,
    text_of,
)

if TYPE_CHECKING:
    import torch


def label_index(id2label: dict[Any, Any], wanted: Sequence[str], where: str) -> dict[str, int]:
    """Map each `wanted` label (lower case) to its logit index in a config's `id2label` (keys
    ints or digit strings); a `ScorerError` naming `where` when one is absent, listing what was
    found, or when two ids carry the same label."""
    found: dict[str, int] = {}
    for idx, label in sorted((int(i), str(lab)) for i, lab in (id2label or {}).items()):
        key = label.strip().lower()
        if key in found:
            raise ScorerError(f"{where}: id2label names {label!r} twice (ids {found[key]}, {idx})")
        found[key] = idx
    missing = [w for w in wanted if w not in found]
    if missing:
        listed = ", ".join(str(id2label[k]) for k in id2label) or "nothing"
        raise ScorerError(
            f"{where}: config.id2label lacks label(s) {missing}; found: {listed} "
            "(a checkpoint without a label map shows LABEL_0, LABEL_1, ...)"
        )
    return {w: found[w] for w in wanted}


def truncation_length(max_length: int, tokenizer: Any, config: Any) -> int:
    """Tokens a classifier reads: min(the parameter, the tokenizer's limit, the positions).

    RoBERTa-style models (position ids offset by `pad_token_id + 1`) lose those positions.
    A tokenizer without a limit reports a huge `model_max_length`; it is then ignored.
    """
    limits = [max_length]
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limits.append(tok_max)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        if any(t in str(getattr(config, "model_type", "")) for t in ("roberta", "camembert")):
            positions -= int(getattr(config, "pad_token_id", 1) or 0) + 1
        limits.append(positions)
    return max(1, min(limits))


class HFClassifier(Scorer):
    """Base of the classifier scorers; subclasses name the labels and map probabilities."""

    num_cpus = 0.5  # fractional: several scorer actors share a small machine
    wants_gpu = True
    labels: ClassVar[tuple[str, ...]] = ()  # lower-case labels that must be in id2label
    default_params: ClassVar[dict[str, Any]] = {**SCORER_PARAMS["sentiment"], "model": ""}

    def __init__(self, params: dict[str, Any], context: ScorerContext) -> None:
        super().__init__(params, context)
        from workers.models import pick_device

        self.device = pick_device(context.device)
        self.tokenizer, self.model = self._load()
        where = f"scorer {self.name!r}, model {self.params['model']!r}"
        self.index = label_index(self.model.config.id2label, self.wanted_labels(), where)
        self.activation = self._activation()
        self.max_tokens = truncation_length(
            int(self.params["max_length"]), self.tokenizer, self.model.config
        )

    def wanted_labels(self) -> tuple[str, ...]:
        return self.labels

    def _load(self) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        model_id, rev = self.params["model"], self.params["revision"]
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_id, revision=rev)
            model = AutoModelForSequenceClassification.from_pretrained(model_id, revision=rev)
        except (OSError, ValueError) as exc:
            raise ScorerError(
                f"scorer {self.name!r}: cannot load {model_id!r} (revision {rev}): {exc}"
            ) from exc
        model.to(self.device).eval()
        return tokenizer, model

    def _activation(self) -> str:
        """softmax for single-label heads; sigmoid for multi-label ones (e.g. Detoxify's)."""
        if self.params["activation"] != "auto":
            return str(self.params["activation"])
        config = self.model.config
        declared = getattr(config, "function_to_apply", None)  # set by some hub checkpoints
        if declared in ("sigmoid", "softmax"):
            return str(declared)
        if getattr(config, "problem_type", None) == "multi_label_classification":
            return "sigmoid"
        return "sigmoid" if config.num_labels == 1 else "softmax"

    @property
    def version(self) -> str:
        # The hub commit the weights came from when no revision was pinned ("main" moves).
        rev = self.params["revision"] or getattr(self.model.config, "_commit_hash", None) or "local"
        field = self.params["text_field"]
        if field == "prompt+continuation":
            field += f"/{TEXT_JOIN}"  # the join changed (nothing inserted): score again
        return f"hf:{self.params['model']}@{rev}:{field}:max{self.params['max_length']}:{self.activation}"

    def score(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return score_nonempty(self, rows, int(self.params["batch_size"]), self._score_batch)

    def probabilities(self, texts: list[str]) -> torch.Tensor:
        """(B, num_labels) probabilities of `texts` under the configured activation."""
        import torch

        enc = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            logits = self.model(**enc).logits.float()  # (B, num_labels)
        return torch.sigmoid(logits) if self.activation == "sigmoid" else logits.softmax(-1)

    def _score_batch(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        texts = [text_of(r, self.params["text_field"]) for r in rows]
        probs = self.probabilities(texts).cpu().tolist()
        return [
            {**self.key(row), **self.values({lab: float(p[i]) for lab, i in self.index.items()})}
            for row, p in zip(rows, probs)
        ]

    def values(self, probs: dict[str, float]) -> dict[str, Any]:
        """The metric's columns from the wanted labels' probabilities."""
        raise NotImplementedError


class SentimentClassifier(HFClassifier):
    """P(positive) of a binary sentiment classifier (default: DistilBERT SST-2)."""

    name = "sentiment"
    metric = "sentiment"
    labels = ("negative", "positive")
    default_params = SCORER_PARAMS["sentiment"]

    def values(self, probs: dict[str, float]) -> dict[str, Any]:
        return {"sentiment": probs["positive"]}


class RegardClassifier(HFClassifier):
    """Regard (Sheng et al.) of prompt + continuation: the label and its four probabilities."""

    name = "regard"
    metric = "regard"
    labels = ("negative", "neutral", "positive", "other")
    default_params = SCORER_PARAMS["regard"]

    def values(self, probs: dict[str, float]) -> dict[str, Any]:
        label = max(self.labels, key=lambda lab: probs[lab])  # ties: the first in `labels`
        return {"regard_label": label, **{f"regard_{lab}": probs[lab] for lab in self.labels}}


class ToxicityClassifier(HFClassifier):
    """Offline toxicity: the probability of one label of an HF toxicity classifier."""

    name = "toxicity-hf"
    metric = "toxicity"
    default_params = SCORER_PARAMS["toxicity-hf"]

    def wanted_labels(self) -> tuple[str, ...]:
        return (str(self.params["label"]).lower(),)

    @property
    def version(self) -> str:
        return f"{super().version}:{str(self.params['label']).lower()}"

    def values(self, probs: dict[str, float]) -> dict[str, Any]:
        return {"toxicity": probs[str(self.params["label"]).lower()]}

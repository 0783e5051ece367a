"""Scorers by name, imported lazily (the driver never imports torch or transformers)."""

from __future__ import annotations

import difflib
import importlib
from typing import Any

SCORERS: dict[str, str] = {
    "gender": "workers.scorers.gender:GenderLabels",
    "sentiment-vader": "workers.scorers.vader:VaderSentiment",
    "sentiment": "workers.scorers.classifier:SentimentClassifier",
    "regard": "workers.scorers.classifier:RegardClassifier",
    "toxicity-hf": "workers.scorers.classifier:ToxicityClassifier",
    "perspective": "workers.scorers.perspective:PerspectiveToxicity",
    "perplexity": "workers.scorers.perplexity:Perplexity",
}

# metric of each scorer, known without importing it (the planner and aggregation use it).
SCORER_METRICS: dict[str, str] = {
    "gender": "gender",
    "sentiment-vader": "sentiment",
    "sentiment": "sentiment",
    "regard": "regard",
    "toxicity-hf": "toxicity",
    "perspective": "toxicity",
    "perplexity": "perplexity",
}


def check_scorer_name(name: str) -> None:
    if name not in SCORERS:
        close = difflib.get_close_matches(name, list(SCORERS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown scorer {name!r}{hint} (known: {', '.join(sorted(SCORERS))})")


def load_scorer(name: str) -> type[Any]:
    check_scorer_name(name)
    module, _, attr = SCORERS[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]

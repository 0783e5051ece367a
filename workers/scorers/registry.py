"""Scorers by name, imported lazily (the driver never imports torch or transformers)."""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from workers.plugins import load_plugins

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
    load_plugins()
    if name not in SCORERS:
        close = difflib.get_close_matches(name, list(SCORERS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown scorer {name!r}{hint} (known: {', '.join(sorted(SCORERS))})")


def load_scorer(name: str) -> type[Any]:
    check_scorer_name(name)
    module, _, attr = SCORERS[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


# Parameter defaults that plugin scorers declare (built-ins: the class's `default_params`).
PLUGIN_PARAMS: dict[str, dict[str, Any]] = {}


def register_scorer(
    name: str, target: str, metric: str, params: dict[str, Any] | None = None
) -> None:
    """Add a scorer from outside the tree (see workers/plugins.py): `target` is `"module:Class"`
    (a `workers.scorers.base.Scorer`, imported only where it runs), `metric` the column it
    fills."""
    if ":" not in target:
        raise ValueError(f"scorer {name!r}: target {target!r} is not 'module:Class'")
    from results.schema import METRIC_FIELDS

    if metric not in METRIC_FIELDS:
        raise ValueError(
            f"scorer {name!r}: unknown metric {metric!r}; known: {sorted(METRIC_FIELDS)}"
        )
    if name in SCORERS and SCORERS[name] != target:
        raise ValueError(f"scorer {name!r} is already registered as {SCORERS[name]}")
    SCORERS[name] = target
    SCORER_METRICS[name] = metric
    if params is not None:
        PLUGIN_PARAMS[name] = dict(params)


def scorer_defaults(name: str) -> dict[str, Any]:
    """Parameter defaults of `name` (imports a built-in scorer's module, which is torch-free)."""
    check_scorer_name(name)
    if name in PLUGIN_PARAMS:
        return dict(PLUGIN_PARAMS[name])
    return dict(getattr(load_scorer(name), "default_params", {}))

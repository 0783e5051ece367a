"""Scorers by name: their classes (as `"module:Class"` text), the metric each fills, parameter
defaults (the built-ins' classes' own: tests/test_catalog.py) and kinds. Torch-free:
`workers.scorers.registry` imports the classes and loads plugins, which add theirs here."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from jobs.catalog.kinds import check_kinds, kind_error, kind_of_default, unknown_name

SCORERS: dict[str, str] = {
    "gender": "workers.scorers.gender:GenderLabels",
    "sentiment-vader": "workers.scorers.vader:VaderSentiment",
    "sentiment": "workers.scorers.classifier:SentimentClassifier",
    "regard": "workers.scorers.classifier:RegardClassifier",
    "toxicity-hf": "workers.scorers.classifier:ToxicityClassifier",
    "perspective": "workers.scorers.perspective:PerspectiveToxicity",
    "perplexity": "workers.scorers.perplexity:Perplexity",
}

# The metric each scorer fills (its columns: results.schema.METRIC_FIELDS); the planner,
# aggregation and the run record read it without importing the scorer.
SCORER_METRICS: dict[str, str] = {
    "gender": "gender",
    "sentiment-vader": "sentiment",
    "sentiment": "sentiment",
    "regard": "regard",
    "toxicity-hf": "toxicity",
    "perspective": "toxicity",
    "perplexity": "perplexity",
}

_CLASSIFIER: dict[str, Any] = {
    "revision": None,
    "batch_size": 32,
    "text_field": "continuation",
    "max_length": 512,
    "activation": "auto",
}
# Parameter defaults per scorer: the built-ins' (their classes' `default_params`) and those a
# plugin declares; a plugin that declares none is absent (its class's `default_params` hold them).
SCORER_PARAMS: dict[str, dict[str, Any]] = {
    "gender": {},
    "sentiment-vader": {"text_field": "continuation"},
    "sentiment": {
        "model": "distilbert/distilbert-base-uncased-finetuned-sst-2-english",
        **_CLASSIFIER,
    },
    "regard": {"model": "sasha/regardv3", **_CLASSIFIER, "text_field": "prompt+continuation"},
    "toxicity-hf": {"model": "unitary/unbiased-toxic-roberta", **_CLASSIFIER, "label": "toxicity"},
    "perspective": {
        "endpoint": None,
        "api_key_file": None,
        "attribute": "TOXICITY",
        "languages": ["en"],
        "text_field": "continuation",
        "qps": 1.0,
        "quota_window_s": 60.0,
        "batch_size": 100,
        "max_retries": 6,
        "backoff_initial_s": 20.0,
        "backoff_max_s": 300.0,
        "timeout_s": 60.0,
        "cache_file": None,
        "cache_only": False,
        "progress": True,
    },
    "perplexity": {
        "model": "openai-community/gpt2-xl",
        "revision": None,
        "dtype": "float32",
        "batch_size": 16,
    },
}

# Declared kinds of scorer parameters whose default does not tell it (a null: what it may be
# instead), per scorer; the others have the kind of their default (jobs/catalog/kinds.py).
SCORER_KINDS: dict[str, dict[str, str]] = {
    **{name: {"revision": "str?"} for name in ("sentiment", "regard", "toxicity-hf", "perplexity")},
    "perspective": {
        "endpoint": "str?",  # null: PERSPECTIVE_API_ENDPOINT, else the public endpoint
        "api_key_file": "str?",  # null: PERSPECTIVE_API_KEY
        "cache_file": "str?",  # null: <cache_dir>/perspective-scores.sqlite
    },
}


# What the built-in scorers accept, by parameter name: the few values some take, and closed
# lower bounds (`positive`: above 0). `check_scorer_params` reads them when a config is checked;
# the scorers themselves read `SCORER_CHOICES` too.
SCORER_CHOICES: dict[str, tuple[str, ...]] = {
    "text_field": ("continuation", "prompt+continuation"),
    "activation": ("auto", "softmax", "sigmoid"),
    "dtype": ("float32", "float16", "bfloat16"),
}
SCORER_MINIMA: dict[str, float] = {"batch_size": 1, "max_length": 1, "max_retries": 0}
_POSITIVE = ("qps", "quota_window_s", "timeout_s", "backoff_initial_s", "backoff_max_s")


def check_scorer_params(
    name: str, params: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, str]:
    """Problems of scorer `name`'s given `params` against its `defaults` (which name every
    parameter it takes) and declared kinds; a built-in's also against `SCORER_CHOICES` and
    its bounds. Returns {parameter: problem}; empty when all is well."""
    builtin = SCORERS.get(name, "").startswith("workers.")
    out = {}
    for key, value in params.items():
        if key not in defaults:
            out[key] = unknown_name(f"{name} parameter", key, defaults)
            continue
        problem = kind_error(scorer_param_kind(name, key, defaults[key]), value)
        if problem is None and builtin and value is not None:
            low = SCORER_MINIMA.get(key)
            if key in SCORER_CHOICES and value not in SCORER_CHOICES[key]:
                problem = f"must be one of {', '.join(SCORER_CHOICES[key])}"
            elif low is not None and value < low:
                problem = f"must be at least {low}"
            elif key in _POSITIVE and value <= 0:
                problem = "must be above 0"
        if problem is not None:
            out[key] = f"{value!r} {problem}"
    return out


class UnknownScorerError(KeyError):
    """A scorer name the catalog does not hold; `args[0]` is the message."""


def check_scorer_name(name: str) -> None:
    """Raise `UnknownScorerError` (with the nearest names) unless `name` is in the catalog."""
    if name not in SCORERS:
        raise UnknownScorerError(unknown_name("scorer", name, SCORERS))


def scorer_param_kind(name: str, param: str, default: Any = None) -> str:
    """Declared kind of `param` of scorer `name`, else the kind of its `default`."""
    declared = SCORER_KINDS.get(name, {}).get(param)
    return declared or kind_of_default(default, containers=True)


def add_scorer(
    name: str,
    target: str,
    metric: str,
    metrics: Collection[str],
    params: dict[str, Any] | None = None,
    kinds: dict[str, str] | None = None,
) -> None:
    """Add a scorer from outside the tree (a plugin): `target` is `"module:Class"`, `metric`
    the one it fills, among `metrics` (results.schema.METRIC_FIELDS, which the caller passes:
    the catalog sits below `results`), `params` its defaults, `kinds` their declared kinds."""
    if ":" not in target:
        raise ValueError(f"scorer {name!r}: target {target!r} is not 'module:Class'")
    if metric not in metrics:
        raise ValueError(f"scorer {name!r}: unknown metric {metric!r}; known: {sorted(metrics)}")
    if name in SCORERS and SCORERS[name] != target:
        raise ValueError(f"scorer {name!r} is already registered as {SCORERS[name]}")
    declared = None if kinds is None else check_kinds(f"scorer {name!r}", kinds)
    SCORERS[name] = target
    SCORER_METRICS[name] = metric
    if params is not None:
        SCORER_PARAMS[name] = dict(params)
    if declared is not None:
        SCORER_KINDS[name] = declared

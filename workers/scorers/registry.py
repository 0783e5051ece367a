"""Scorers by name, imported lazily (the driver never imports torch or transformers).

What a scorer is called, its `"module:Class"`, its metric and its parameter defaults are the
catalog's (`jobs.catalog`, torch-free). This module adds the plugins (loaded before every
lookup), the import of a scorer's class and `register_scorer`, the call an `--include` module
makes.
"""

from __future__ import annotations

from typing import Any

import jobs.catalog as catalog
from workers.plugins import after_plugins, import_target

# the catalog's lookup, after the plugins; raises `jobs.catalog.UnknownScorerError` (a KeyError)
check_scorer_name = after_plugins(catalog.check_scorer_name)


def load_scorer(name: str) -> type[Any]:
    check_scorer_name(name)
    return import_target(catalog.SCORERS[name])


def register_scorer(
    name: str,
    target: str,
    metric: str,
    params: dict[str, Any] | None = None,
    kinds: dict[str, str] | None = None,
) -> None:
    """Add a scorer from outside the tree (see workers/plugins.py): `target` is `"module:Class"`
    (a `workers.scorers.base.Scorer`, imported only where it runs), `metric` the column it
    fills, `params` its defaults (else its class's `default_params`), `kinds` their declared
    kinds (else those of the defaults)."""
    from results.schema import METRIC_FIELDS

    catalog.add_scorer(name, target, metric, METRIC_FIELDS, params=params, kinds=kinds)


def scorer_defaults(name: str) -> dict[str, Any]:
    """Parameter defaults of `name`: the catalog's, else (a plugin that declared none) its
    class's `default_params` (imports the scorer's module, which imports no torch)."""
    check_scorer_name(name)
    if name in catalog.SCORER_PARAMS:
        return dict(catalog.SCORER_PARAMS[name])
    return dict(getattr(load_scorer(name), "default_params", {}))


def check_params(name: str, params: dict[str, Any]) -> dict[str, str]:
    """{parameter: problem} of `params` given to scorer `name` (`jobs.catalog.check_scorer_params`
    against its defaults, a plugin's included); empty when all is well."""
    return catalog.check_scorer_params(name, params, scorer_defaults(name))

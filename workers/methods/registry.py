"""Methods by name, imported lazily so the driver never imports torch.

What a method is called, its `"module:Class"`, its parameter defaults and kinds, and how a job's
parameters resolve are the catalog's (`jobs.catalog`, torch-free). This module adds the plugins
(loaded before every lookup), the import of a method's class (inside the generation actor) and
`register_method`, the call an `--include` module makes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import jobs.catalog as catalog
from workers.plugins import load_plugins


def check_method_name(name: str) -> None:
    """Load the plugins, then raise `jobs.catalog.UnknownMethodError` for an unknown `name`."""
    load_plugins()
    catalog.check_method_name(name)


def resolve_params(
    name: str,
    params: dict[str, Any],
    model_id: str,
    task: str | None = None,
    heads: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`jobs.catalog.resolve_params` once the plugins are loaded (a plugin method's too)."""
    load_plugins()
    return catalog.resolve_params(name, params, model_id, task, heads)


def load_method(name: str) -> type[Any]:
    """Import the method class registered under `name` (inside actors only)."""
    check_method_name(name)
    module, _, attr = catalog.METHODS[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def register_method(
    name: str,
    target: str,
    params: dict[str, Any] | None = None,
    kinds: dict[str, str] | None = None,
) -> None:
    """Add a method from outside the tree (see workers/plugins.py).

    `target` is `"module:Class"` (a `DecodingMethod`, imported only inside actors), `params`
    its parameter defaults, `kinds` optional declared kinds (else those of the defaults).
    """
    catalog.add_method(name, target, params=params, kinds=kinds)

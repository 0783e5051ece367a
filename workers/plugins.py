"""Methods and scorers from outside the tree (docs/cli.md, "Plugins"): entry points naming
plain dicts (read on the driver, so torch-free) and `--include` modules that call
`register_method` / `register_scorer`. Both land in the torch-free catalog (`jobs.catalog`);
included module names reach Ray workers in `LIDAO_HARNESS_INCLUDE`, and target classes are
imported only inside actors. Also the lazy registry behind `workers.methods.registry` and
`workers.scorers.registry`: the catalog's lookups after the plugins, and the class imports.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, ParamSpec, TypeVar

import jobs.catalog as catalog

INCLUDE_ENV = "LIDAO_HARNESS_INCLUDE"
METHOD_GROUP = "lidao_harness.methods"
SCORER_GROUP = "lidao_harness.scorers"

_state = {"loaded": False, "loading": False}
# Held while a model, a method or a scorer is built in this process (`--no-ray`: generation
# and the scorers that follow it in two threads): concurrent imports of transformers' lazy
# modules fail (docs/footguns.md), and only construction imports them.
BUILDING = threading.RLock()


class PluginError(ValueError):
    """A plugin that cannot be loaded; the message names the module or entry point."""


def include(modules: list[str]) -> None:
    """Import `modules` now and record them for Ray workers (environment variable)."""
    have = [m for m in os.environ.get(INCLUDE_ENV, "").split(",") if m]
    os.environ[INCLUDE_ENV] = ",".join(dict.fromkeys(have + list(modules)))
    _state["loaded"] = False
    load_plugins()


def load_plugins() -> None:
    """Register every entry point and included module (once per process; idempotent)."""
    if _state["loaded"] or _state["loading"]:
        return
    _state["loading"] = True
    try:
        for group in (METHOD_GROUP, SCORER_GROUP):
            for ep in entry_points(group=group):
                try:
                    spec = ep.load()
                except Exception as exc:
                    raise PluginError(
                        f"entry point {ep.name} = {ep.value} ({group}): cannot import ({exc})"
                    ) from exc
                _register(group, ep.name, spec, f"entry point {ep.name} = {ep.value}")
        for module in filter(None, os.environ.get(INCLUDE_ENV, "").split(",")):
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise PluginError(f"--include {module}: cannot import ({exc})") from exc
        _state["loaded"] = True
    finally:
        _state["loading"] = False


def _register(group: str, name: str, spec: Any, where: str) -> None:
    s = {"target": spec} if isinstance(spec, str) else spec
    if not isinstance(s, dict) or not isinstance(s.get("target"), str):
        raise PluginError(f"{where}: expected a dict with a 'target': 'module:Class' string")
    scorer = group == SCORER_GROUP
    if scorer and not isinstance(s.get("metric"), str):
        raise PluginError(f"{where}: a scorer entry needs 'metric' (e.g. 'toxicity')")
    options = {"params": s.get("params"), "kinds": s.get("kinds")}
    try:
        if scorer:
            register_scorer(name, s["target"], s["metric"], **options)
        else:
            register_method(name, s["target"], **options)
    except ValueError as exc:
        raise PluginError(f"{where}: {exc}") from None


def import_target(target: str, what: str = "") -> type[Any]:
    """The class a catalog target (`"module:Class"`) names, imported now (inside actors only);
    `PluginError` naming `what` (`scorer 'x'`) and the target when it cannot be."""
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except Exception as exc:  # noqa: BLE001 - a plugin's module may raise anything on import
        raise PluginError(
            f"{what or 'target'} ({target}): cannot import ({type(exc).__name__}: {exc})"
        ) from exc


P = ParamSpec("P")
R = TypeVar("R")


def after_plugins(lookup: Callable[P, R]) -> Callable[P, R]:
    """`lookup` (a catalog function) run once the plugins are loaded, so that it sees their
    methods and scorers too."""

    @functools.wraps(lookup)
    def looked_up(*args: P.args, **kwargs: P.kwargs) -> R:
        load_plugins()
        return lookup(*args, **kwargs)

    return looked_up


# the catalog's lookups, after the plugins (a plugin's methods, scorers and parameters too)
check_method_name = after_plugins(catalog.check_method_name)
check_scorer_name = after_plugins(catalog.check_scorer_name)  # UnknownScorerError: a KeyError
resolve_params = after_plugins(catalog.resolve_params)
# What an `--include` module calls: `target` is `"module:Class"` (a `DecodingMethod`, imported
# only inside actors), `params` its defaults, `kinds` declared kinds (else those of the defaults).
register_method = catalog.add_method


def load_method(name: str) -> type[Any]:
    """Import the method class registered under `name` (inside actors only)."""
    check_method_name(name)
    return import_target(catalog.METHODS[name], f"method {name!r}")


def load_scorer(name: str) -> type[Any]:
    """Import the scorer class registered under `name` (inside actors only)."""
    check_scorer_name(name)
    return import_target(catalog.SCORERS[name], f"scorer {name!r}")


def register_scorer(
    name: str,
    target: str,
    metric: str,
    params: dict[str, Any] | None = None,
    kinds: dict[str, str] | None = None,
) -> None:
    """Add a scorer from outside the tree: `target` is `"module:Class"` (a
    `workers.scorers.base.Scorer`), `metric` the column it fills, `params` its defaults (else
    its class's `default_params`), `kinds` their declared kinds (else those of the defaults)."""
    from results.schema import METRIC_FIELDS

    catalog.add_scorer(name, target, metric, METRIC_FIELDS, params=params, kinds=kinds)


def scorer_defaults(name: str) -> dict[str, Any]:
    """Parameter defaults of `name`: the catalog's, else (a plugin that declared none) its
    class's `default_params` (imports the scorer's module, which imports no torch)."""
    check_scorer_name(name)
    if name in catalog.SCORER_PARAMS:
        return dict(catalog.SCORER_PARAMS[name])
    return dict(getattr(load_scorer(name), "default_params", {}))


def check_scorer_params(name: str, params: dict[str, Any]) -> dict[str, str]:
    """{parameter: problem} of `params` given to scorer `name` (`jobs.catalog.check_scorer_params`
    against its defaults, a plugin's included); empty when all is well."""
    return catalog.check_scorer_params(name, params, scorer_defaults(name))

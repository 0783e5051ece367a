"""Methods and scorers from outside the tree: Python entry points and `--include` modules.

Two ways to add a method or a scorer, both torch-free on the driver:

* an installed package declares entry points in the groups `lidao_harness.methods` and
  `lidao_harness.scorers`; each names a plain dict (imported on the driver, so its module must
  not import torch)::

      [project.entry-points."lidao_harness.methods"]
      boost = "my_plugin:BOOST"      # BOOST = {"target": "my_plugin.method:Boost",
                                     #          "params": {"strength": 1.0}}
      [project.entry-points."lidao_harness.scorers"]
      shout = "my_plugin:SHOUT"      # SHOUT = {"target": "my_plugin.scorer:Shout",
                                     #          "metric": "shouting"}

* `harness --include my_module ...` imports `my_module`, which calls
  `workers.methods.registry.register_method` / `workers.scorers.registry.register_scorer`.

Either way the entries land in the torch-free catalog (`jobs.catalog`), which the registries and
the lower floors read; a scorer's entry may also declare `"kinds"` (its parameters' types, shown
by `harness list scorers`), a method's `"kinds"` are checked when a config is validated.

The included module names travel to local Ray workers in the environment variable
`LIDAO_HARNESS_INCLUDE` (set before Ray starts), so actors resolve the same names. The target
classes are imported only where they run (inside actors), like the built-in ones.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, ParamSpec, TypeVar

from jobs.catalog import add_method, add_scorer

log = logging.getLogger(__name__)

INCLUDE_ENV = "LIDAO_HARNESS_INCLUDE"
METHOD_GROUP = "lidao_harness.methods"
SCORER_GROUP = "lidao_harness.scorers"

_state = {"loaded": False, "loading": False}
# Held while a model, a method or a scorer is built in this process (`--no-ray`: the generator
# in the driver's thread, scorers that follow generation in another). Building one imports
# transformers' lazy modules, and two threads importing them at once see half-initialised
# modules ("cannot import name 'AutoModelForCausalLM'"); once built, decoding and scoring
# import nothing more (measured), so only construction is serialised.
BUILDING = threading.RLock()


class PluginError(ValueError):
    """A plugin that cannot be loaded; the message names the module or entry point."""


def include(modules: list[str]) -> None:
    """Import `modules` now and record them for Ray workers (environment variable)."""
    have = [m for m in os.environ.get(INCLUDE_ENV, "").split(",") if m]
    for module in modules:
        if module not in have:
            have.append(module)
    os.environ[INCLUDE_ENV] = ",".join(have)
    _state["loaded"] = False
    load_plugins()


def load_plugins() -> None:
    """Register every entry point and included module (once per process; idempotent)."""
    if _state["loaded"] or _state["loading"]:
        return
    _state["loading"] = True
    try:
        for group, register in ((METHOD_GROUP, _register_method), (SCORER_GROUP, _register_scorer)):
            for ep in entry_points(group=group):
                try:
                    spec = ep.load()
                except Exception as exc:
                    raise PluginError(
                        f"entry point {ep.name} = {ep.value} ({group}): cannot import ({exc})"
                    ) from exc
                register(ep.name, spec, f"entry point {ep.name} = {ep.value}")
        for module in filter(None, os.environ.get(INCLUDE_ENV, "").split(",")):
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise PluginError(f"--include {module}: cannot import ({exc})") from exc
        _state["loaded"] = True
    finally:
        _state["loading"] = False


def _spec(spec: Any, where: str) -> dict[str, Any]:
    if isinstance(spec, str):
        return {"target": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("target"), str):
        raise PluginError(f"{where}: expected a dict with a 'target': 'module:Class' string")
    return spec


def _register_method(name: str, spec: Any, where: str) -> None:
    s = _spec(spec, where)
    try:
        add_method(name, s["target"], params=s.get("params"), kinds=s.get("kinds"))
    except ValueError as exc:
        raise PluginError(f"{where}: {exc}") from None


def _register_scorer(name: str, spec: Any, where: str) -> None:
    from results.schema import METRIC_FIELDS

    s = _spec(spec, where)
    if not isinstance(s.get("metric"), str):
        raise PluginError(f"{where}: a scorer entry needs 'metric' (e.g. 'toxicity')")
    try:
        add_scorer(
            name,
            s["target"],
            s["metric"],
            METRIC_FIELDS,
            params=s.get("params"),
            kinds=s.get("kinds"),
        )
    except ValueError as exc:
        raise PluginError(f"{where}: {exc}") from None


def import_target(target: str) -> type[Any]:
    """The class a catalog target (`"module:Class"`) names, imported now (inside actors only)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


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

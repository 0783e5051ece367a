"""The torch-free catalog (`jobs.catalog`): it knows every built-in method and scorer as the
classes declare them, plugins land in it, and the lower floors (the planner, the joins) see
their entries once the plugins are loaded."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobs.catalog as catalog
from jobs.catalog import (
    DEFAULT_PARAMS,
    METHODS,
    PLUGIN_KINDS,
    SCORER_KINDS,
    SCORER_METRICS,
    SCORER_PARAMS,
    SCORERS,
    kind_error,
)
from jobs.grid import expand_grid
from jobs.spec import GenerationParams, ModelRef
from workers import plugins
from workers.methods.base import DecodingMethod
from workers.methods.registry import load_method, register_method, resolve_params
from workers.scorers.base import Scorer
from workers.scorers.registry import load_scorer, register_scorer, scorer_defaults

BUILTIN_METHODS = dict(METHODS)
BUILTIN_SCORERS = dict(SCORERS)
TABLES: list[dict[str, Any]] = [
    METHODS,
    DEFAULT_PARAMS,
    PLUGIN_KINDS,
    SCORERS,
    SCORER_METRICS,
    SCORER_PARAMS,
    SCORER_KINDS,
]


@pytest.fixture
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Plugins loaded anew in this test; the catalog's tables as they were afterwards."""
    saved = [dict(t) for t in TABLES]
    monkeypatch.setitem(plugins._state, "loaded", False)
    monkeypatch.setenv(plugins.INCLUDE_ENV, "")  # restored afterwards, `include` or not
    yield
    for table, old in zip(TABLES, saved, strict=True):
        table.clear()
        table.update(old)


def classes(package: str, base: type) -> dict[str, type]:
    """Every class of `package`'s modules that subclasses `base` and names itself (`name`)."""
    found = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        module = importlib.import_module(f"{package}.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            own = cls.__module__ == module.__name__ and "name" in vars(cls)
            if own and issubclass(cls, base) and cls is not base:
                found[str(vars(cls)["name"])] = cls
    return found


def test_the_catalog_knows_every_built_in_method_class() -> None:
    found = classes("workers.methods", DecodingMethod)
    assert sorted(found) == sorted(BUILTIN_METHODS)
    for name, cls in found.items():
        assert BUILTIN_METHODS[name] == f"{cls.__module__}:{cls.__name__}"
        assert load_method(name) is cls


def test_the_registry_resolves_a_method_s_parameters_as_the_catalog_does() -> None:
    for name in BUILTIN_METHODS:
        for model in ("gpt2-large", "tiiuae/falcon-7b-instruct", "tiny-random/gpt2"):
            mine = resolve_params(name, {}, model, "sentiment", {"sentiment": "h.pt"})
            assert mine == catalog.resolve_params(
                name, {}, model, "sentiment", {"sentiment": "h.pt"}
            )
            assert set(mine) == set(DEFAULT_PARAMS[name])
            for key, value in mine.items():  # every default is of its declared kind
                assert kind_error(catalog.param_kind(name, key), value) is None, (name, key)


def test_the_catalog_knows_every_built_in_scorer_with_its_class_s_defaults() -> None:
    found = classes("workers.scorers", Scorer)
    assert sorted(found) == sorted(BUILTIN_SCORERS)
    for name, cls in found.items():
        assert BUILTIN_SCORERS[name] == f"{cls.__module__}:{cls.__name__}"
        assert load_scorer(name) is cls
        assert SCORER_METRICS[name] == cls.metric
        # same defaults in the same order (`harness list scorers` shows them in that order)
        assert list(SCORER_PARAMS[name].items()) == list(cls.default_params.items()), name
        assert scorer_defaults(name) == cls.default_params
        assert set(SCORER_KINDS.get(name, {})) <= set(cls.default_params), name
        for key, default in cls.default_params.items():  # every default is of its kind
            kind = catalog.scorer_param_kind(name, key, default)
            assert kind_error(kind, default) is None, (name, key)
            assert not kind.startswith("any"), (name, key)  # a null default is declared


def test_a_plugin_method_and_scorer_from_entry_points_land_in_the_catalog(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Point:
        def __init__(self, name: str, spec: dict[str, Any]) -> None:
            self.name, self.value, self.spec = name, f"somewhere:{name}", spec

        def load(self) -> dict[str, Any]:
            return self.spec

    points = {
        plugins.METHOD_GROUP: [
            Point("nudge", {"target": "pkg.method:Nudge", "params": {"strength": 1.5}})
        ],
        plugins.SCORER_GROUP: [
            Point(
                "shout",
                {
                    "target": "pkg.scorer:Shout",
                    "metric": "toxicity",
                    "params": {"words": None, "level": 2},
                    "kinds": {"words": "list?"},
                },
            )
        ],
    }
    monkeypatch.setattr(plugins, "entry_points", lambda group: points[group])
    assert "nudge" not in METHODS and "shout" not in SCORERS
    plugins.load_plugins()
    assert METHODS["nudge"] == "pkg.method:Nudge" and DEFAULT_PARAMS["nudge"] == {"strength": 1.5}
    assert SCORERS["shout"] == "pkg.scorer:Shout" and SCORER_METRICS["shout"] == "toxicity"
    assert SCORER_PARAMS["shout"] == {"words": None, "level": 2}
    assert catalog.scorer_param_kind("shout", "words") == "list?"
    assert catalog.scorer_param_kind("shout", "level", 2) == "int"
    # the planner (jobs, below the plugin loader) resolves the plugin method from the catalog
    grid = expand_grid(
        [catalog_prompt()],
        [(ModelRef("tiny-random/gpt2"), GenerationParams())],
        [("nudge", {"strength": 3.0})],
        ["sentiment"],
        1,
    )
    assert [job.params() for job in grid] == [{"strength": 3.0}]
    with pytest.raises(ValueError, match="parameter strength = 'lots': must be a number"):
        catalog.resolve_params("nudge", {"strength": "lots"}, "tiny-random/gpt2")


def catalog_prompt() -> Any:
    from jobs.datasets import Prompt

    return Prompt("p:00000", None, "none", "The doctor said")


INCLUDED = """
from workers.methods.registry import register_method
from workers.scorers.registry import register_scorer
register_method("calm", "calm_pkg:Calm", params={"depth": 2})
register_scorer("calm-score", "calm_pkg:CalmScore", "sentiment", params={"cutoff": 0.5})
"""


def test_an_included_module_s_method_and_scorer_land_in_the_catalog(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "calm_plugin.py").write_text(INCLUDED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "calm_plugin", raising=False)
    plugins.include(["calm_plugin"])
    assert METHODS["calm"] == "calm_pkg:Calm" and DEFAULT_PARAMS["calm"] == {"depth": 2}
    assert SCORER_METRICS["calm-score"] == "sentiment"  # what the joins and the run record read
    assert scorer_defaults("calm-score") == {"cutoff": 0.5}
    from results.stats import join

    assert join.SCORER_METRICS["calm-score"] == "sentiment"


def test_plugins_with_bad_kinds_or_metrics_are_refused_by_name(fresh_plugins: None) -> None:
    with pytest.raises(ValueError, match=r"method 'odd': parameter x: unknown kind 'number'"):
        register_method("odd", "pkg:Odd", params={"x": 1}, kinds={"x": "number"})
    with pytest.raises(ValueError, match=r"scorer 'odd': kinds must be a mapping"):
        register_scorer("odd", "pkg:Odd", "sentiment", kinds=["x"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"scorer 'odd': unknown metric 'loudness'"):
        register_scorer("odd", "pkg:Odd", "loudness")
    with pytest.raises(ValueError, match=r"scorer 'gender' is already registered as"):
        register_scorer("gender", "pkg:Odd", "gender")
    assert "odd" not in METHODS and "odd" not in SCORERS and "odd" not in SCORER_KINDS


def test_list_scorers_shows_declared_kinds_and_null_defaults() -> None:
    from harness.cli.listing import list_scorers

    lines = list_scorers()
    assert "    revision: str? = null" in lines  # the classifiers' and perplexity's
    assert "    endpoint: str? = null" in lines  # perspective's
    assert '    languages: list = ["en"]' in lines
    assert not [line for line in lines if "any?" in line]


@pytest.mark.parametrize(
    ("kind", "value", "error"),
    [
        ("int", True, "must be a whole number"),
        ("float", float("nan"), "must be finite"),
        ("str?", None, None),
        ("str", None, "must not be null"),
        ("list", "en", "must be a list"),
        ("list?", ["en"], None),
        ("dict", [], "must be a mapping"),
        ("any", None, None),
    ],
)
def test_kinds_accept_and_refuse_values(kind: str, value: Any, error: str | None) -> None:
    assert kind_error(kind, value) == error

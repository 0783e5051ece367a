"""The catalog: what can be named in a config, known without importing torch or any class.

Methods (`methods`: name → `"module:Class"`, parameter defaults, kinds, choices and ranges,
`resolve_params`), scorers (`scorers`: name → `"module:Class"`, metric, defaults, kinds), the
paper's settings per model and LM family (`paper`), the parameter kinds (`kinds`). It sits on
the lowest floor, so the planner, the statistics and the run record read it without reaching
up into `workers`. Its tables are mutable: `workers.plugins.load_plugins` adds plugin entries
(`add_method` / `add_scorer`); the catalog never loads plugins itself, so lower-floor code
sees them once the process's entry point has (docs/footguns.md).
"""

from jobs.catalog.kinds import kind_error, kind_label
from jobs.catalog.methods import (
    DEFAULT_PARAMS,
    METHODS,
    PARAM_CHOICES,
    PARAM_RANGES,
    PLUGIN_KINDS,
    UnknownMethodError,
    add_method,
    check_method_name,
    param_kind,
    resolve_params,
    takes_head,
)
from jobs.catalog.paper import (
    FAMILY_TUNING,
    PAPER_MODELS,
    PPLM_FAMILY,
    paper_generation,
)
from jobs.catalog.scorers import (
    SCORER_CHOICES,
    SCORER_KINDS,
    SCORER_METRICS,
    SCORER_PARAMS,
    SCORERS,
    UnknownScorerError,
    add_scorer,
    check_scorer_name,
    check_scorer_params,
    scorer_param_kind,
)

__all__ = [
    "DEFAULT_PARAMS",
    "FAMILY_TUNING",
    "PPLM_FAMILY",
    "METHODS",
    "PAPER_MODELS",
    "PARAM_CHOICES",
    "PARAM_RANGES",
    "PLUGIN_KINDS",
    "SCORERS",
    "SCORER_CHOICES",
    "SCORER_KINDS",
    "SCORER_METRICS",
    "SCORER_PARAMS",
    "UnknownMethodError",
    "UnknownScorerError",
    "add_method",
    "add_scorer",
    "check_method_name",
    "check_scorer_name",
    "check_scorer_params",
    "kind_error",
    "kind_label",
    "paper_generation",
    "param_kind",
    "resolve_params",
    "scorer_param_kind",
    "takes_head",
]

"""The catalog: what can be named in a config, known without importing torch or any class.

Methods (`jobs.catalog.methods`): name → `"module:Class"`, parameter defaults, declared kinds,
choices and ranges, and `resolve_params` (a job's effective parameters). Scorers
(`jobs.catalog.scorers`): name → `"module:Class"`, the metric it fills, parameter defaults and
kinds. The paper's settings per model and LM family (`jobs.catalog.paper`). The parameter kinds
(`jobs.catalog.kinds`).

The catalog sits on the lowest floor, so the planner (`jobs.grid`), the statistics and the run
record read it without reaching up into `workers`. The built-in entries are declared here.

Plugins: the catalog's tables are mutable, and it never loads plugins itself (the loader,
`workers.plugins`, sits above it). `workers.plugins.load_plugins` (entry points, `--include`
modules) adds plugin entries with `add_method` / `add_scorer`, directly or through
`workers.methods.registry.register_method` / `workers.scorers.registry.register_scorer`. The
registries' lookups (`check_method_name`, `resolve_params`, `check_scorer_name`, `load_*`) load
plugins first and then read the catalog. Lower-floor code reads the catalog as it stands: it
sees plugin entries once the entry point of the process has loaded them. The CLI does (its
`--include`, `list`, `status`), the config does when it validates method and scorer names (so
every run has them before it plans), and the actors do when they resolve a name.
"""

from jobs.catalog.kinds import kind_error, kind_label, kind_of_default
from jobs.catalog.methods import (
    DEFAULT_PARAMS,
    METHODS,
    PARAM_CHOICES,
    PARAM_KINDS,
    PARAM_RANGES,
    PLUGIN_KINDS,
    UnknownMethodError,
    add_method,
    check_method_name,
    check_param_values,
    param_kind,
    resolve_params,
    takes_head,
)
from jobs.catalog.paper import (
    FAMILY_TUNING,
    PAPER_MODELS,
    PPLM_PAPER,
    TUNED_METHODS,
    model_defaults,
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
    "METHODS",
    "PAPER_MODELS",
    "PARAM_CHOICES",
    "PARAM_KINDS",
    "PARAM_RANGES",
    "PLUGIN_KINDS",
    "PPLM_PAPER",
    "SCORERS",
    "SCORER_CHOICES",
    "SCORER_KINDS",
    "SCORER_METRICS",
    "SCORER_PARAMS",
    "TUNED_METHODS",
    "UnknownMethodError",
    "UnknownScorerError",
    "add_method",
    "add_scorer",
    "check_method_name",
    "check_param_values",
    "check_scorer_name",
    "check_scorer_params",
    "kind_error",
    "kind_label",
    "kind_of_default",
    "model_defaults",
    "paper_generation",
    "param_kind",
    "resolve_params",
    "scorer_param_kind",
    "takes_head",
]

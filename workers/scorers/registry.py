"""Scorers by name, imported lazily so the driver never imports torch (`workers.plugins`).

What a scorer is called, its `"module:Class"`, its metric and its parameter defaults are the
catalog's (`jobs.catalog`); `check_params` gives {parameter: problem} of a scorer's parameters.
"""

from workers.plugins import check_scorer_name, load_scorer, register_scorer, scorer_defaults
from workers.plugins import check_scorer_params as check_params

__all__ = ["check_params", "check_scorer_name", "load_scorer", "register_scorer", "scorer_defaults"]

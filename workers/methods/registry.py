"""Methods by name, resolved lazily so the driver never imports torch.

Each entry is `"module:Class"`; `load_method` imports it inside the generation actor. The
torch-free side (names, parameter defaults, validation) is what the planner and config use.
"""

from __future__ import annotations

import difflib
import importlib
import math
from collections.abc import Mapping
from typing import Any

from workers.plugins import load_plugins

METHODS: dict[str, str] = {
    "vanilla": "workers.methods.base:Vanilla",
    "uddia": "workers.methods.lidao:Uddia",
    "lidao-min": "workers.methods.lidao:LidaoMin",
    "lidao-prod": "workers.methods.lidao:LidaoProd",
    "elidao-min": "workers.methods.elidao:ElidaoMin",
    "elidao-prod": "workers.methods.elidao:ElidaoProd",
    "pplm": "workers.methods.pplm:PPLM",
    "gedi": "workers.methods.gedi:GeDi",
    "dexperts": "workers.methods.dexperts:DExperts",
}

# Parameter defaults per method (torch-free), resolved into each job's `method_params`.
# A method may also declare per-model-family defaults in PAPER_DEFAULTS.
# Bias-tuned methods: `lr` / `tau` None = the LM family's value (FAMILY_TUNING) at load time;
# `blocks` = top blocks tuned (clamped to the depth); `scope` = context | last; `head` = a head
# file (None: the task's default head, random for tiny-random/* models).
_TUNED: dict[str, Any] = {"lr": None, "tau": None, "blocks": 18, "scope": "context", "head": None}

DEFAULT_PARAMS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    # UDDIA: `prior` = token counts file (`harness token-prior`) weighting the gate's B_a
    # (None: uniform); `redo` = regenerate rows with PPL > 30 with 3 fewer blocks, ≤ 6 tries.
    "uddia": {**_TUNED, "lam": 0.05, "redo": False, "prior": None},
    "lidao-min": {**_TUNED, "gamma": 0.5},
    "lidao-prod": dict(_TUNED),
    # `instruction`: None (by family), "plain" (GPT-2/OPT template), "instruct" (Falcon's), or a
    # custom template containing #GENDER#.
    "elidao-min": {**_TUNED, "gamma": 0.5, "instruction": None},
    "elidao-prod": {**_TUNED, "instruction": None},
    # Baselines (docstrings of workers/methods/{pplm,gedi,dexperts}.py). None = resolved at load
    # time: PPLM `steps` by family (3 Falcon, else 10); GeDi codes / class_bias and DExperts
    # `alpha` by task (the published settings for toxicity and sentiment).
    "pplm": {
        "steps": None,
        "step_size": 0.2,
        "kl_scale": 0.01,
        "gm_scale": 0.9,
        "gamma": 1.0,
        "horizon_length": 1,
        "window_length": 0,
        "decay": False,
        "head": None,
    },
    "gedi": {
        "gedi_model": None,
        "code_desired": None,
        "code_undesired": None,
        "disc_weight": 30.0,
        "filter_p": 0.8,
        "target_p": 0.8,
        "class_bias": None,
    },
    "dexperts": {"expert": None, "anti_expert": None, "alpha": None, "filter_p": 0.9},
}

# PPLM steps / step size of the paper's appendix (OPT, Falcon); GPT-2 large as DExperts/UDDIA ran it.
PPLM_PAPER: dict[str, dict[str, Any]] = {
    "gpt2-large": {"steps": 10, "step_size": 0.2},
    "facebook/opt-6.7b": {"steps": 10, "step_size": 0.2},
    "tiiuae/falcon-7b-instruct": {"steps": 3, "step_size": 0.2},
}

TUNED_METHODS = ("uddia", "lidao-min", "lidao-prod", "elidao-min", "elidao-prod")

# Learning rate and mixing weight τ per LM family (method.md); "other" = any other decoder LM.
FAMILY_TUNING: dict[str, dict[str, float]] = {
    "gpt2": {"lr": 0.01, "tau": 0.9},
    "opt": {"lr": 0.006, "tau": 0.8},
    "falcon": {"lr": 0.01, "tau": 0.8},
    "other": {"lr": 0.01, "tau": 0.8},
}

# The paper's hyper-parameter table (its Table 6): tuned-method parameters, sampling parameters
# (for the config's generation defaults) and the variant the paper reports per model.
PAPER_MODELS: dict[str, dict[str, Any]] = {
    "gpt2-large": {
        "method": {"lr": 0.01, "blocks": 18, "tau": 0.9},
        "generation": {"top_p": 0.9, "temperature": 1.0, "repetition_penalty": 1.0},
        "variant": "min",
        "samples_per_prompt": 10,
    },
    "facebook/opt-6.7b": {
        "method": {"lr": 0.006, "blocks": 18, "tau": 0.8},
        "generation": {"top_p": 0.9, "temperature": 0.75, "repetition_penalty": 1.2},
        "variant": "min",
        "samples_per_prompt": 5,
    },
    "tiiuae/falcon-7b-instruct": {
        "method": {"lr": 0.01, "blocks": 18, "tau": 0.8},
        "generation": {"top_p": 0.9, "temperature": 0.75, "repetition_penalty": 1.2},
        "variant": "prod",
        "samples_per_prompt": 5,
    },
}
_PAPER_ALIASES = {"openai-community/gpt2-large": "gpt2-large"}


def paper_generation(model_id: str) -> dict[str, Any]:
    """The paper's sampling parameters for `model_id` (top-p, temperature, repetition penalty);
    empty for a model the paper did not run."""
    paper = PAPER_MODELS.get(_PAPER_ALIASES.get(model_id, model_id))
    return dict(paper["generation"]) if paper is not None else {}


class UnknownMethodError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def check_method_name(name: str) -> None:
    load_plugins()
    if name not in METHODS:
        close = difflib.get_close_matches(name, list(METHODS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownMethodError(
            f"unknown method {name!r}{hint} (known: {', '.join(sorted(METHODS))})"
        )


def takes_head(name: str) -> bool:
    """Whether method `name` reads an attribute head (its `head` parameter)."""
    return "head" in DEFAULT_PARAMS.get(name, {})


def resolve_params(
    name: str,
    params: dict[str, Any],
    model_id: str,
    task: str | None = None,
    heads: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Effective parameters of `name` for `model_id`: defaults, then model defaults, then user.

    With `task`, a method that reads an attribute head gets `head` = the method's own `head`
    parameter when the user set one (an override for every model and task), else the model's
    head for that task (`heads`, the model entry's `heads: {TASK: PATH}`), else None.
    """
    check_method_name(name)
    defaults = dict(DEFAULT_PARAMS.get(name, {}))
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(
            f"method {name!r}: unknown parameter(s) {unknown}; known: {sorted(defaults) or 'none'}"
        )
    bad = check_param_values(name, params)
    if bad:
        raise ValueError(f"method {name!r}: " + "; ".join(bad))
    resolved = {**defaults, **model_defaults(name, model_id), **params}
    if task is not None and takes_head(name) and params.get("head") is None:
        resolved["head"] = (heads or {}).get(task)
    return resolved


def model_defaults(name: str, model_id: str) -> dict[str, Any]:
    """Per-model defaults (the paper's hyper-parameter table); empty for unknown models."""
    paper = PAPER_MODELS.get(_PAPER_ALIASES.get(model_id, model_id))
    if name in TUNED_METHODS and paper is not None:
        return dict(paper["method"])
    if name == "pplm":
        return dict(PPLM_PAPER.get(_PAPER_ALIASES.get(model_id, model_id), {}))
    return {}


def load_method(name: str) -> type[Any]:
    """Import the method class registered under `name` (inside actors only)."""
    check_method_name(name)
    module, _, attr = METHODS[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


# ---- parameter types (checked when the config is validated, before anything starts) ---------

# Declared type of each built-in parameter, by name (names mean the same in every method):
# "float", "int", "bool", "str", "any"; a trailing "?" allows null (resolved at load time).
PARAM_KINDS: dict[str, str] = {
    "lr": "float?",
    "tau": "float?",
    "blocks": "int",
    "scope": "str",
    "head": "any",  # a head file, or null for the task's default head
    "lam": "float",
    "redo": "bool",
    "gamma": "float",
    "instruction": "str?",
    "steps": "int?",
    "step_size": "float",
    "kl_scale": "float",
    "gm_scale": "float",
    "horizon_length": "int",
    "window_length": "int",
    "decay": "bool",
    "gedi_model": "str?",
    "code_desired": "str?",
    "code_undesired": "str?",
    "disc_weight": "float",
    "filter_p": "float",
    "target_p": "float",
    "class_bias": "float?",
    "expert": "str?",
    "anti_expert": "str?",
    "alpha": "float?",
}
PARAM_CHOICES: dict[str, tuple[str, ...]] = {"scope": ("context", "last")}
# Closed ranges (low, high), None = unbounded.
PARAM_RANGES: dict[str, tuple[float | None, float | None]] = {
    "lr": (0.0, None),
    "tau": (0.0, 1.0),
    "blocks": (1, None),
    "steps": (0, None),
    "horizon_length": (1, None),
    "window_length": (0, None),
    "filter_p": (0.0, 1.0),
    "target_p": (0.0, 1.0),
}
# Kinds declared by plugins (register_method(kinds=...)), per method.
PLUGIN_KINDS: dict[str, dict[str, str]] = {}


def param_kind(method: str, param: str) -> str:
    """Declared kind of `param` of `method`; for plugins, declared or that of the default."""
    declared = PLUGIN_KINDS.get(method, {}).get(param)
    if declared is None and method in PLUGIN_KINDS:
        default = DEFAULT_PARAMS.get(method, {}).get(param)
        kinds = {bool: "bool", int: "int", float: "float", str: "str"}
        declared = kinds.get(type(default), "any") + ("" if default is not None else "?")
    return declared or PARAM_KINDS.get(param, "any")


def _kind_error(kind: str, value: Any) -> str | None:
    base, nullable = kind.rstrip("?"), kind.endswith("?")
    if value is None:
        return None if nullable or base == "any" else "must not be null"
    if base == "bool" and not isinstance(value, bool):
        return "must be true or false"
    if base == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be a whole number"
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if not math.isfinite(value):
            return "must be finite"
    if base == "str" and not isinstance(value, str):
        return "must be a string"
    return None


def check_param_values(name: str, params: dict[str, Any]) -> list[str]:
    """Errors of the given parameter values of `name` (types, choices, ranges); [] if fine."""
    errors = []
    for key, value in params.items():
        problem = _kind_error(param_kind(name, key), value)
        if problem is None and value is not None and name not in PLUGIN_KINDS:
            choices = PARAM_CHOICES.get(key)
            low, high = PARAM_RANGES.get(key, (None, None))
            if choices is not None and value not in choices:
                problem = f"must be one of {', '.join(choices)}"
            elif (low is not None and value < low) or (high is not None and value > high):
                problem = f"must be in [{low}, {'inf' if high is None else high}]"
        if problem is not None:
            errors.append(f"parameter {key} = {value!r}: {problem}")
    return errors


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
    if ":" not in target:
        raise ValueError(f"method {name!r}: target {target!r} is not 'module:Class'")
    if name in METHODS and METHODS[name] != target:
        raise ValueError(f"method {name!r} is already registered as {METHODS[name]}")
    METHODS[name] = target
    DEFAULT_PARAMS[name] = dict(params or {})
    PLUGIN_KINDS[name] = dict(kinds or {})

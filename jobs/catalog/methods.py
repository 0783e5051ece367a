"""Methods by name: their classes (as `"module:Class"` text), parameter defaults and kinds, and
the resolution of a job's parameters. Torch-free: `workers.methods.registry` imports the
classes (inside actors) and loads plugins, which add their methods here (`add_method`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.catalog.kinds import check_kinds, kind_error, kind_of_default, unknown_name
from jobs.catalog.paper import model_defaults

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

# Parameter defaults per method, resolved into each job's `method_params`.
# A method may also declare per-model-family defaults (jobs/catalog/paper.py).
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
    # time: PPLM `steps` and `step_size` by family (`PPLM_FAMILY`); GeDi codes / class_bias and
    # DExperts `alpha` by task (the published settings for toxicity and sentiment).
    "pplm": {
        "steps": None,
        "step_size": None,
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

# Declared kind of the built-in parameters whose default is null (names mean the same in
# every method); the others have the kind of their default (jobs/catalog/kinds.py).
PARAM_KINDS: dict[str, str] = {
    **dict.fromkeys("lr tau class_bias alpha step_size".split(), "float?"),
    "steps": "int?",
    **dict.fromkeys(
        "instruction gedi_model code_desired code_undesired expert anti_expert".split(), "str?"
    ),
}
PARAM_CHOICES: dict[str, tuple[str, ...]] = {"scope": ("context", "last")}
# Closed ranges (low, high), None = unbounded.
PARAM_RANGES: dict[str, tuple[float | None, float | None]] = {
    "lr": (0.0, None),
    "tau": (0.0, 1.0),
    "blocks": (1, None),
    "steps": (0, None),
    "step_size": (0.0, None),
    "horizon_length": (1, None),
    "window_length": (0, None),
    "filter_p": (0.0, 1.0),
    "target_p": (0.0, 1.0),
    "kl_scale": (0.0, None),
    "gm_scale": (0.0, 1.0),
    "gamma": (0.0, None),
}
# Kinds declared by plugins (`add_method(kinds=...)`), per method.
PLUGIN_KINDS: dict[str, dict[str, str]] = {}


class UnknownMethodError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def check_method_name(name: str) -> None:
    """Raise `UnknownMethodError` (with the nearest names) unless `name` is in the catalog."""
    if name not in METHODS:
        raise UnknownMethodError(unknown_name("method", name, METHODS))


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


def param_kind(method: str, param: str) -> str:
    """Declared kind of `param` of `method` (by a plugin, else `PARAM_KINDS`), else the kind of
    its default."""
    declared = PLUGIN_KINDS.get(method, {}).get(param) or PARAM_KINDS.get(param)
    return declared or kind_of_default(DEFAULT_PARAMS.get(method, {}).get(param))


def check_param_values(name: str, params: dict[str, Any]) -> list[str]:
    """Errors of the given parameter values of `name` (types, choices, ranges); [] if fine."""
    errors = []
    for key, value in params.items():
        problem = kind_error(param_kind(name, key), value)
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


def add_method(
    name: str,
    target: str,
    params: dict[str, Any] | None = None,
    kinds: dict[str, str] | None = None,
) -> None:
    """Add a method from outside the tree (a plugin): `target` is `"module:Class"`, `params`
    its parameter defaults, `kinds` optional declared kinds (else those of the defaults)."""
    if ":" not in target:
        raise ValueError(f"method {name!r}: target {target!r} is not 'module:Class'")
    if name in METHODS and METHODS[name] != target:
        raise ValueError(f"method {name!r} is already registered as {METHODS[name]}")
    declared = check_kinds(f"method {name!r}", kinds or {})
    METHODS[name] = target
    DEFAULT_PARAMS[name] = dict(params or {})
    PLUGIN_KINDS[name] = declared

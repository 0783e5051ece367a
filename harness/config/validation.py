"""Validating a config's data: every error found, reported at once in one `ConfigError`.

Pydantic's errors get "did you mean" for misspelt keys and the value for wrong types; method,
scorer and tiny model names and method parameters are checked against their registries; the
grid's size against `runtime.max_jobs`.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.config.reading import ConfigError
from harness.config.sections import RunConfig


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that the path `loc` (below RunConfig) points into."""
    cls: type[BaseModel] | None = RunConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = cls.model_fields.get(str(part)) if cls is not None else None
        if field is None:
            return None
        cls = _model_in(field.annotation)
    return cls


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _pydantic_errors(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            owner = _model_at(loc[:-1])
            known = list(owner.model_fields) if owner is not None else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            msg = "unknown key" + (f"; did you mean {close[0]}?" if close else "")
        elif err["type"] in ("int_type", "float_type", "bool_type") and isinstance(
            err.get("input"), bool | str
        ):
            msg = f"{msg}, got {err['input']!r}"
        elif err["type"] == "value_error" and loc:
            # a section's check that names its field ("gguf_file: ..."): name it in the path
            key, sep, rest = str(err.get("ctx", {}).get("error", "")).partition(": ")
            owner = _model_at(loc)
            if sep and owner is not None and key in owner.model_fields:
                where, msg = f"{where}.{key}", rest
        elif err["type"] == "string_type" and isinstance(err.get("input"), int | float):
            # YAML reads an unquoted 1234567 or 1e5 (a short commit hash, say) as a number
            msg = f"{msg}, got the number {err['input']!r}: quote the value to keep it text"
        lines.append(f"  {where}: {msg}")
    return lines


def _name_errors(data: dict[str, Any]) -> list[str]:
    """Unknown method / scorer / tiny model names and bad method parameters, from the raw data."""
    from workers.methods.registry import check_method_name, resolve_params
    from workers.scorers.registry import check_params, check_scorer_name
    from workers.tiny import TINY_PREFIX, check_tiny_id

    errors = []
    models = [m for m in as_list(data.get("models")) if isinstance(m, dict)]
    ids = list(dict.fromkeys(m["id"] for m in models if isinstance(m.get("id"), str))) or ["(any)"]
    slices: dict[str, int] = {}  # (model, method, resolved parameters) → its first entry
    for i, m in enumerate(as_list(data.get("methods"))):
        name, params = _named(m)
        if not isinstance(name, str) or not isinstance(params, dict):
            continue  # the type errors are pydantic's
        try:
            check_method_name(name)
            resolved = [resolve_params(name, params, mid) for mid in ids]
        except (KeyError, ValueError) as exc:
            errors.append(f"  methods.{i}: {exc.args[0] if isinstance(exc, KeyError) else exc}")
            continue
        first = min(slices.setdefault(repr((mid, name, r)), i) for mid, r in zip(ids, resolved))
        if first != i:
            errors.append(
                f"  methods.{i}: {name} with these parameters is methods.{first} again (its "
                "jobs would be planned twice); drop one, or give them different parameters"
            )
    named: dict[str, int] = {}
    for i, sc in enumerate(as_list(data.get("scorers"))):
        name, params = _named(sc)
        if not isinstance(name, str):
            continue
        try:
            check_scorer_name(name)
        except KeyError as exc:
            errors.append(f"  scorers.{i}: {exc.args[0]}")
            continue
        if named.setdefault(name, i) != i:
            errors.append(
                f"  scorers.{i}: {name} is scorers.{named[name]} again; a run keeps one "
                "setting per scorer (scores/<scorer>/): drop one"
            )
        if isinstance(params, dict):
            for key, problem in check_params(name, params).items():
                errors.append(f"  scorers.{i}.params.{key}: {problem}")
    for i, model in enumerate(models):
        mid = model.get("id")
        if isinstance(mid, str) and mid.startswith(TINY_PREFIX) and check_tiny_id(mid):
            errors.append(f"  models.{i}.id: {check_tiny_id(mid)}")
    return errors


def _named(entry: Any) -> tuple[Any, Any]:
    """(name, params) of a method or scorer entry (`- vanilla` or `{name: ..., params: ...}`)."""
    if isinstance(entry, dict):
        return entry.get("name"), entry.get("params", {})
    return entry, {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def check_grid_size(cfg: RunConfig, n_prompts: int | None, source: str = "<config>") -> int:
    """The grid's size, computed without building it; refused above `runtime.max_jobs`.
    `n_prompts` None: before the prompts are read, the jobs of one prompt alone."""
    size = (n_prompts or 1) * len(cfg.models) * len(cfg.methods) * len(cfg.tasks)
    size *= cfg.samples_per_prompt
    if size > cfg.runtime.max_jobs:
        axes = (
            f"{len(cfg.models)} models × {len(cfg.methods)} methods × {len(cfg.tasks)} tasks × "
            f"{cfg.samples_per_prompt:,} samples"
        )
        what = f"per prompt ({axes})" if n_prompts is None else f"({n_prompts:,} prompts × {axes})"
        raise ConfigError(
            f"{source}: the grid has {size:,} jobs {what}, more than runtime.max_jobs = "
            f"{cfg.runtime.max_jobs:,}; lower it or raise max_jobs"
        )
    return size


def parse_config(data: Any, source: str = "<config>") -> RunConfig:
    """Validate `data`; every error found is reported at once in one ConfigError."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    errors = []
    cfg = None
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        errors += _pydantic_errors(exc)
    errors += _name_errors(data)
    if cfg is not None and not errors:
        try:
            check_grid_size(cfg, None, source)  # refuse an absurd grid before reading prompts
        except ConfigError as exc:
            errors.append("  " + str(exc).split(": ", 1)[1])
    if errors:
        raise ConfigError(
            "\n".join([f"{source}: invalid config ({len(errors)} error(s))", *errors])
        )
    assert cfg is not None
    return cfg

"""Parameter kinds, the small type language of method and scorer parameters: `float`, `int`,
`bool`, `str`, `list`, `dict` or `any`, a trailing `?` allowing null (a value resolved at load
time). A config's parameter values are checked against them; `harness list` shows them."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from typing import Any

_KIND_OF_TYPE: dict[type, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    list: "list",
    dict: "dict",
}


def kind_of_default(default: Any, containers: bool = False) -> str:
    """The kind a parameter gets from its default alone: that of its type (`list` and `dict`
    only with `containers`; else `any`), nullable (`?`) when the default is null."""
    kind = _KIND_OF_TYPE.get(type(default), "any")
    if kind in ("list", "dict") and not containers:
        kind = "any"
    return kind + ("?" if default is None else "")


def kind_label(kind: str) -> str:
    """How `harness list` shows a kind: `any?` (an unknown type that may be null) is `any`,
    every other kind as declared (`str?`: a string or null)."""
    return "any" if kind.rstrip("?") == "any" else kind


def kind_error(kind: str, value: Any) -> str | None:
    """Why `value` is not of `kind`, or None when it is."""
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
    if base == "list" and not isinstance(value, list):
        return "must be a list"
    if base == "dict" and not isinstance(value, dict):
        return "must be a mapping"
    return None


def check_kinds(owner: str, kinds: Any) -> dict[str, str]:
    """`kinds` ({parameter: kind}) as declared by a plugin, checked; `owner` names it in errors."""
    if not isinstance(kinds, dict):
        raise ValueError(f"{owner}: kinds must be a mapping of parameter → kind, got {kinds!r}")
    known = sorted({*_KIND_OF_TYPE.values(), "any"})
    for param, kind in kinds.items():
        if not isinstance(kind, str) or kind.rstrip("?") not in known or kind.count("?") > 1:
            raise ValueError(
                f"{owner}: parameter {param}: unknown kind {kind!r}; use one of "
                f"{', '.join(known)} (a trailing ? allows null)"
            )
    return {str(p): k for p, k in kinds.items()}


def unknown_name(what: str, name: str, known: Iterable[str]) -> str:
    """The message for a `what` (method, scorer) named `name` that is not among `known`, with
    the nearest names."""
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"unknown {what} {name!r}{hint} (known: {', '.join(names) or 'none'})"

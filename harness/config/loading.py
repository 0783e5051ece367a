"""A run config in and out: `load_config` (a YAML file, with the command-line settings applied
before validation: `--set KEY=VALUE` and the options of `run` / `validate`, to a checked
`RunConfig`) and `dump_config` (a `RunConfig` to the config.yaml snapshot, secrets redacted).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from harness.config.reading import (
    ConfigError,
    UniqueKeyLoader,
    load_yaml,
    looks_local,
    read_text,
    resolve_paths,
)
from harness.config.sections import RunConfig
from harness.config.validation import as_list, parse_config
from jobs.redact import REDACTED, is_secret_key, redact_text, redacted


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read and validate a YAML config; relative dataset and model paths resolve against its
    folder. `overrides` (command-line options, see `apply_overrides`) apply before validation,
    so the snapshot written beside the outputs records them."""
    p = Path(path)
    data = load_yaml(read_text(p), str(path))
    overrides = dict(overrides or {})
    sets = overrides.pop("set", None) or []
    if isinstance(data, dict):
        data = apply_sets(data, sets, str(path))
        data = resolve_paths(data, p.resolve().parent)
        if overrides:
            data = apply_overrides(data, overrides)
    try:
        return parse_config(data, str(path))
    except ConfigError as exc:
        if not sets:
            raise
        given = ", ".join(f"--set {shown(s)}" for s in sets)
        raise ConfigError(f"{exc}\n  (with {given})") from None


def dump_config(config: RunConfig) -> str:
    return yaml.safe_dump(redacted(config), sort_keys=False)


# List entries that may be given as a bare string, and the field that string is.
_NAMED = {"methods": "name", "scorers": "name", "models": "id"}


def shown(item: str) -> str:
    """A `KEY=VALUE` setting for a message: a secret-looking key's value replaced."""
    key, eq, raw = item.partition("=")
    last = key.strip().rsplit(".", 1)[-1]
    return f"{key}={REDACTED}" if eq and is_secret_key(last) else redact_text(item)


def apply_sets(data: dict[str, Any], sets: list[str], source: str) -> dict[str, Any]:
    """`data` with each `KEY=VALUE` applied, as if written in the file (so relative paths
    resolve against the config's folder): KEY is a dotted path whose numbers index lists
    (`models.0.dtype`, `methods.1.params.gamma`, `aggregation.n_boot`), VALUE is read as YAML
    (`3` a number, `true` a bool, `[a, b]` a list, `null`). A method or scorer given by name
    only (`- vanilla`) becomes `{name: vanilla}` when a field below it is set.

    Raises:
        ConfigError: a malformed setting, an index past a list's end, a path through a
            value that is not a mapping or a list; the message names the key.
    """
    out = copy.deepcopy(data)
    for item in sets:
        key, eq, raw = item.partition("=")
        key = key.strip()
        parts = key.split(".")
        if not eq or not key or any(not part for part in parts):
            raise ConfigError(
                f"--set {shown(item)!r}: expected KEY=VALUE (e.g. models.0.dtype=bfloat16)"
            )
        try:
            value = yaml.load(raw, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or exc
            raise ConfigError(f"--set {key}: the value is not valid YAML ({problem})") from None
        node: Any = out
        for depth, part in enumerate(parts):
            here = ".".join(parts[: depth + 1])
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit():
                    raise ConfigError(
                        f"--set {key}: {'.'.join(parts[:depth]) or source} is a list; "
                        f"index it with a number (0 to {len(node) - 1}), not {part!r}"
                    )
                index = int(part)
                if index > len(node):
                    raise ConfigError(
                        f"--set {key}: {'.'.join(parts[:depth])} has {len(node)} entries "
                        f"(index {index}; {len(node)} appends one)"
                    )
                if index == len(node):
                    node.append({})
                if last:
                    node[index] = value
                    break
                if isinstance(node[index], str) and depth == 1 and parts[0] in _NAMED:
                    node[index] = {_NAMED[parts[0]]: node[index]}
                if node[index] is None:
                    node[index] = {}
                node = node[index]
            elif isinstance(node, dict):
                if last:
                    node[part] = value
                    break
                if node.get(part) is None:
                    node[part] = [] if parts[depth + 1].isdigit() else {}
                node = node[part]
            else:
                raise ConfigError(
                    f"--set {key}: {'.'.join(parts[:depth])} is {node!r}, not a mapping or a "
                    f"list, so it has no field {here.rsplit('.', 1)[-1]!r}"
                )
    return out


# Command-line override → where it goes in the config.
OVERRIDES = {
    "limit": ("dataset", "limit"),
    "samples": ("samples_per_prompt",),
    "batch_size": ("runtime", "batch_size"),
    "device": ("runtime", "device"),
    "address": ("runtime", "ray_address"),
}


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`data` with command-line overrides: `limit`, `samples`, `batch_size`, `device` set their
    fields; `models` / `methods` (lists of names) keep the config's entries of those names
    (a model by id or `name`) and add plain entries for the others, in the order given."""
    out = dict(data)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in OVERRIDES:
            *parents, leaf = OVERRIDES[key]
            node = out
            for part in parents:
                node[part] = dict(node.get(part) or {})
                node = node[part]
            node[leaf] = value
        elif key == "models":
            have = [m for m in as_list(out.get("models")) if isinstance(m, dict)]
            out["models"] = [_pick(have, v, ("id", "name"), "id") for v in value]
        elif key == "methods":
            have = [{"name": m} if isinstance(m, str) else m for m in as_list(out.get("methods"))]
            out["methods"] = [_pick(have, v, ("name",), "name") for v in value]
        else:
            raise ConfigError(f"unknown override {key!r}")
    return out


def _pick(entries: list[Any], wanted: str, keys: tuple[str, ...], new_key: str) -> Any:
    for entry in entries:
        if isinstance(entry, dict) and any(entry.get(k) == wanted for k in keys):
            return entry
    if new_key == "id" and looks_local(wanted, Path.cwd()):
        wanted = str(Path(wanted).expanduser().resolve())
    return {new_key: wanted}

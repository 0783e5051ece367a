"""Reading a config file: UTF-8 text, strict YAML (a key given twice is refused), and the
relative paths in it resolved against the file's folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the field."""


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (naming it and both lines)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: SafeLoader reports it
            if not duplicate:
                seen[key] = line
            else:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first given on line {first})",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads `1e-3` and `1e9` as strings (its floats need a dot); YAML 1.2 and
# every user read them as numbers: `lr: 1e-3` must not fail as "must be a number".
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


MAX_VALUES = 100_000  # values in a config with its aliases expanded; real configs hold < 1k


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML text strictly (duplicate keys refused); errors name `source` and the line.
    Aliases that expand to more than `MAX_VALUES` values are refused: nine nested aliases of
    nine make 387M values, which every later walk of the config (validation, messages, job
    ids) would expand, without bound in time or memory."""
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark is not None else ""
        raise ConfigError(
            f"{source}:{where} not valid YAML ({getattr(exc, 'problem', None) or exc})"
        ) from None
    size = expanded_size(data, {})
    if size < 0 or size > MAX_VALUES:
        what = (
            f"expand to more than {MAX_VALUES:,} values" if size > 0 else "make a value hold itself"
        )
        raise ConfigError(f"{source}: its aliases (*name) {what}; write the repeated parts out")
    return data


def expanded_size(value: Any, sizes: dict[int, int | None]) -> int:
    """Values in `value` with every shared (aliased) container counted at each use, or -1 when
    a container holds itself (`&a [*a]`). Each container is walked once (`sizes` by id), so a
    bomb costs the size of its text, not its own."""
    if not isinstance(value, dict | list):
        return 1
    if id(value) in sizes:
        known = sizes[id(value)]
        return -1 if known is None else known  # None: still being walked: a cycle
    sizes[id(value)] = None
    total = 1
    for item in [*value.keys(), *value.values()] if isinstance(value, dict) else value:
        inner = expanded_size(item, sizes)
        if inner < 0:
            return -1
        total = min(total + inner, MAX_VALUES + 1)  # past the bound: the sums stay small
    sizes[id(value)] = total
    return total


def read_text(path: str | Path, what: str = "config") -> str:
    """A UTF-8 text file; unreadable or binary input names the file (and line of a bad byte)."""
    if Path(path).exists() and not Path(path).is_file() and not Path(path).is_dir():
        # a named pipe without a writer blocks the read forever (prompt files are refused alike)
        raise ConfigError(f"{path}: not a regular file (a named pipe, a socket or a device)")
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            f"is this a {what} file?"
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{path}: line {line}: a NUL byte; is this a {what} file?")
    return text


def looks_local(value: str, base: Path) -> bool:
    """A model or tokenizer given as a path: explicit (./, ../, /, ~) or an existing folder."""
    return value.startswith((".", "/", "~")) or (base / value).is_dir()


def resolve_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """`data` with its local dataset, seed-word, model, tokenizer, head and scorer-model paths
    absolute (relative ones against `base`); URLs and `builtin` stay as given."""

    def fix(value: Any) -> Any:
        if not isinstance(value, str) or "://" in value or value == "builtin":
            return value
        candidate = Path(value).expanduser()
        return str(candidate if candidate.is_absolute() else (base / candidate).resolve())

    out = dict(data)
    ds = out.get("dataset")
    if isinstance(ds, dict):
        ds = dict(ds)
        if isinstance(ds.get("files"), dict):
            ds["files"] = {k: fix(v) for k, v in ds["files"].items()}
        if "path" in ds:
            ds["path"] = fix(ds["path"])
        out["dataset"] = ds
    if out.get("gender_words") is not None:
        out["gender_words"] = fix(out["gender_words"])
    if isinstance(out.get("models"), list):
        models = []
        for m in out["models"]:
            if isinstance(m, dict):
                m = dict(m)
                for key in ("id", "tokenizer"):
                    value = m.get(key)
                    if isinstance(value, str) and looks_local(value, base):
                        m[key] = fix(value)
                m = _fix_gguf(m, fix)
                if isinstance(m.get("heads"), dict):
                    m["heads"] = {t: fix(h) for t, h in m["heads"].items()}
            models.append(m)
        out["models"] = models
    if isinstance(out.get("scorers"), list):
        out["scorers"] = [_fix_scorer(entry, base, fix) for entry in out["scorers"]]
    return out


def _fix_scorer(entry: Any, base: Path, fix: Any) -> Any:
    """A scorer entry whose `model` / `tokenizer` parameter is a local path (as a model entry's
    id: explicit, an existing folder, or a .gguf file) made absolute against `base`, so that a
    scorer reads the same file as the model entry beside it."""
    params = entry.get("params") if isinstance(entry, dict) else None
    if not isinstance(params, dict):
        return entry
    fixed = dict(params)
    for key in ("model", "tokenizer"):
        value = params.get(key)
        if isinstance(value, str) and not value.startswith("package:"):
            if looks_local(value, base) or value.lower().endswith(".gguf"):
                fixed[key] = fix(value)
    return {**entry, "params": fixed}


def _fix_gguf(model: dict[str, Any], fix: Any) -> dict[str, Any]:
    """A model entry's GGUF file path made absolute (`gguf_file` alone or the same as `id`, or
    an `id` that is a .gguf path); a `package:` spec and transformers' form (`gguf_file` a
    name in the folder `id`) stay as given."""
    out = dict(model)
    spec, mid = model.get("gguf_file"), model.get("id")
    if isinstance(mid, str) and mid.lower().endswith(".gguf") and not mid.startswith("package:"):
        out["id"] = fix(mid)
    if isinstance(spec, str) and not spec.startswith("package:"):
        if mid is None or (isinstance(mid, str) and fix(mid) == fix(spec)):
            out["gguf_file"] = fix(spec)
    return out

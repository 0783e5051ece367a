"""A run config in and out: `load_config` (a YAML file, with command-line overrides, to a
checked `RunConfig`) and `dump_config` (a `RunConfig` to the config.yaml snapshot, secrets
redacted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.config.errors import ConfigError
from harness.config.overrides import apply_overrides, apply_sets, shown
from harness.config.reading import load_yaml, read_text, resolve_paths
from harness.config.sections import RunConfig
from harness.config.validation import parse_config
from jobs.redact import redacted


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

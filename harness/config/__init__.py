"""The run config: a YAML file checked by pydantic, strictly and completely, before anything runs.

Strict: unknown or duplicate keys, wrong types, non-finite floats and unknown names are errors;
complete: every error at once, naming its field (and YAML line), with "did you mean". Rooms:
`sections` (the models), `validation`, `reading` (the file, `ConfigError`), `loading`
(with the command-line settings)."""

from __future__ import annotations

from harness.config.loading import apply_overrides, apply_sets, dump_config, load_config
from harness.config.reading import ConfigError, load_yaml
from harness.config.sections import (
    GenerationConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    ScorerConfig,
)
from harness.config.validation import check_grid_size, parse_config
from jobs.redact import redacted

__all__ = [
    "ConfigError",
    "GenerationConfig",
    "ModelConfig",
    "RunConfig",
    "RuntimeConfig",
    "ScorerConfig",
    "apply_overrides",
    "apply_sets",
    "check_grid_size",
    "dump_config",
    "load_config",
    "load_yaml",
    "parse_config",
    "redacted",
]

"""The run config: a YAML file checked by pydantic, strictly and completely, before anything runs.

Strict: unknown keys, duplicate YAML keys, a bool where a number belongs, non-finite floats,
unknown method / scorer names and method parameter values of the wrong type are errors. Complete:
every error of a file is reported at once, each naming its field (and line, for YAML errors),
with "did you mean" for misspelt keys and names.

The face of the package; its rooms: `sections` (the pydantic models, `RunConfig`), `validation`
(`parse_config`: every error at once; the grid's size), `reading` (UTF-8 text, strict YAML,
relative paths), `overrides` (`--set KEY=VALUE` and the command line's options), `loading`
(`load_config`, `dump_config`), `errors` (`ConfigError`). Redaction is `jobs.redact`'s.
"""

from __future__ import annotations

from harness.config.errors import ConfigError
from harness.config.loading import dump_config, load_config
from harness.config.overrides import OVERRIDES, apply_overrides, apply_sets
from harness.config.reading import load_yaml, read_text
from harness.config.sections import (
    TASKS,
    AggregationConfig,
    DatasetConfig,
    GenerationConfig,
    ModelConfig,
    NamedConfig,
    RunConfig,
    RuntimeConfig,
    ScorerConfig,
)
from harness.config.validation import check_grid_size, grid_factor, parse_config
from jobs.redact import SECRET_KEYS, is_secret_key, redact, redacted

__all__ = [
    "OVERRIDES",
    "SECRET_KEYS",
    "TASKS",
    "AggregationConfig",
    "ConfigError",
    "DatasetConfig",
    "GenerationConfig",
    "ModelConfig",
    "NamedConfig",
    "RunConfig",
    "RuntimeConfig",
    "ScorerConfig",
    "apply_overrides",
    "apply_sets",
    "check_grid_size",
    "dump_config",
    "grid_factor",
    "is_secret_key",
    "load_config",
    "load_yaml",
    "parse_config",
    "read_text",
    "redact",
    "redacted",
]

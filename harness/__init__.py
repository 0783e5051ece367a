"""The face of the harness: CLI, config, and the driver that wires the stages."""

from harness.config import ConfigError, RunConfig, load_config

__all__ = ["ConfigError", "RunConfig", "load_config"]

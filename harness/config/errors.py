"""The one error of the config package."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the field."""

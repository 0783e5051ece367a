"""The command line: `python -m harness` and the `lidao-harness` script (`commands.main`)."""

from harness.cli.commands import main

__all__ = ["main"]

"""The command line: `python -m harness` and the `lidao-harness` script.

`commands` parses arguments and runs a command; the other modules each hold one command or the
checks behind `validate` (`preflight`, `machine`). Nothing below the CLI imports from here.
"""

from harness.cli.commands import main

__all__ = ["main"]

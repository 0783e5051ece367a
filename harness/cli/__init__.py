"""The command line: `python -m harness` and the `lidao-harness` script.

`commands.main` parses (`parser`: every command's options) and runs a command: `run_commands`
(run, score, aggregate: they write a run directory) or the module of a command that only reads
(`status`, `validate` with its checks `preflight` and `machine`, `listing`, `samples` over
`sample_rows`, `export`, `compare`); `human` writes a run's human evaluation. Nothing below
the CLI imports from here.
"""

from harness.cli.commands import main

__all__ = ["main"]

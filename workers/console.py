"""What a process that draws progress bars or prints a summary line asks of its console: is
it a terminal, are bars wanted (`--no-progress` holds for child processes too), does it log
through the CLI's `TqdmHandler` or only to stderr (a Ray actor). Below `harness`, so scorers in
actors (Perspective's bar and line) and the driver's bars ask the same questions.
"""

from __future__ import annotations

import logging
import os
import sys

from tqdm import tqdm

from jobs.redact import redact_text


def is_terminal() -> bool:
    """Bars only when both stdout and stderr are terminals (a redirected or piped run: none)."""
    return sys.stderr.isatty() and sys.stdout.isatty()


def bars_enabled() -> bool:
    """What a bar drawn in this process checks: a terminal, and `--no-progress` not given (it
    sets `TQDM_DISABLE`, which child processes inherit)."""
    return is_terminal() and os.environ.get("TQDM_DISABLE", "") in ("", "0")


class TqdmHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes records with `tqdm.write` (above any bar); URL credentials redacted."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(redact_text(self.format(record)), file=self.stream)
        except Exception:
            self.handleError(record)


def cli_logging() -> bool:
    """Whether this process logs through `harness.progress.setup_logging` (the CLI's driver, or
    --no-ray)."""
    return any(isinstance(h, TqdmHandler) for h in logging.getLogger().handlers)

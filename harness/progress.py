"""Progress bars per stage, and logging that cooperates with them (`workers.console` says what
the console can take). On a terminal: tqdm bars on stderr, log lines above them. Otherwise no
bars: a plain line per stage at most every `plain_every_s` seconds and one at its end."""

from __future__ import annotations

import logging
import os
import sys
import time

from tqdm import tqdm

from workers import console
from workers.console import TqdmHandler

log = logging.getLogger("harness")

# Environment for child processes (local Ray workers inherit it) when bars are off:
# tqdm's own switch (tqdm >= 4.66 reads TQDM_* defaults), the Hugging Face download bars,
# Ray Data's bars.
QUIET_ENV = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
}


# Loggers of this project; every other logger (matplotlib.font_manager, urllib3, filelock,
# httpx...) prints warnings and errors only, unless `-vv`.
OWN_LOGGERS = ("harness", "workers", "jobs", "results", "__main__")


class OwnOrWarning(logging.Filter):
    """Passes this project's records, and the others' from WARNING up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.split(".")[0] in OWN_LOGGERS


class Progress:
    plain_every_s = 30.0

    def __init__(self, stage: str, total: int, done: int = 0, enabled: bool = True) -> None:
        self.stage, self.total, self.done = stage, total, done
        self.failed = 0
        self.plain = enabled and not console.is_terminal()
        self._last = time.monotonic()
        self.bar = tqdm(
            total=total,
            initial=done,
            desc=stage,
            unit="job",
            disable=not enabled or self.plain or not console.bars_enabled(),
            mininterval=0.5,
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def update(self, n: int, ok: int | None = None) -> None:
        self.done += n
        if ok is not None:
            self.failed += n - ok
            if self.failed:
                self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(n)
        if self.plain and time.monotonic() - self._last >= self.plain_every_s:
            self._line()

    def _line(self) -> None:
        self._last = time.monotonic()
        failed = f", {self.failed} failed" if self.failed else ""
        log.info("%s: %d/%d jobs%s", self.stage, self.done, self.total, failed)

    def close(self) -> None:
        self.bar.close()
        if self.plain:
            self._line()


def setup_logging(verbosity: int = 0, progress: bool = True) -> list[str]:
    """Root logging for the CLI: -v (this project's debug lines), -vv (everyone's), default
    (info), -q (warnings only, Ray's start line included). Other libraries' loggers print
    warnings and errors only, unless -vv.

    Without progress bars (`--no-progress`, or not on a terminal) the child processes' bars
    are switched off too (QUIET_ENV). Returns the environment variables it set (the caller may
    restore them).
    """
    level = logging.DEBUG if verbosity > 0 else logging.WARNING if verbosity < 0 else logging.INFO
    handler = TqdmHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    if verbosity < 2:
        handler.addFilter(OwnOrWarning())
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, TqdmHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    env = {} if console.is_terminal() else {"RAY_COLOR_PREFIX": "0"}  # Ray's coloured "(pid=..)"
    if not progress or not console.is_terminal():
        env.update(QUIET_ENV)
    if verbosity < 0:  # read when ray is imported: its "Started a local Ray instance" line
        env["RAY_LOGGER_LEVEL"] = "warning"
    added = [key for key in env if key not in os.environ]
    for key in added:
        os.environ[key] = env[key]
    return added

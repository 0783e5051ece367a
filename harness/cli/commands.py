"""`python -m harness COMMAND` (also `lidao-harness`): parse, set up logging, run the command,
turn its errors into one line and an exit code: 0 done, 1 a stage failed at run time, 2 bad
input (config, files, names), 3 rows failed for a transient reason (`run` / `score`: a plain
`score RUN` retries them), 130 / 143 interrupted."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence

from harness.cli.parser import build_parser
from harness.config import ConfigError
from harness.progress import setup_logging
from jobs.files import DatasetError
from jobs.redact import printable, redact_text
from results.run.store import StoreError
from results.stats.join import JoinError


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = not getattr(args, "no_progress", False)
    for name, default in (("verbose", 0), ("quiet", 0), ("include", [])):
        if not hasattr(args, name):
            setattr(args, name, default)
    env_set = setup_logging(int(args.verbose) - int(args.quiet), progress)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if args.include:
            from workers.plugins import include

            include(args.include)
        return int(args.func(args))
    except (ConfigError, DatasetError, StoreError, JoinError, KeyError, ValueError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {printable(redact_text(str(text)))}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {printable(redact_text(str(exc)))}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {printable(_os_error(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        from results.run.invoke import interrupted

        interrupt = interrupted(exc)
        line = interrupt.args[0] if interrupt.args and " " in str(interrupt.args[0]) else ""
        print(
            line or "interrupted; what was written is kept; run the same command to resume",
            file=sys.stderr,
        )
        return interrupt.code
    finally:
        if "harness.stages.generation.ray_runtime" in sys.modules:
            from harness.stages.generation.ray_runtime import shutdown_ray

            shutdown_ray()
        for key in env_set:
            os.environ.pop(key, None)


def _os_error(exc: OSError) -> str:
    """One line naming the path (`PATH: No space left on device`), else the command, run and
    stage it was in (`results.run.invoke.driven`), and for a full disk what to do."""
    if exc.filename:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        notes = getattr(exc, "__notes__", None)
        text = str(exc).replace("\n", " ") + (f" (in {notes[-1]})" if notes else "")
    if exc.errno == errno.ENOSPC or "No space left" in text:
        text += "; free some space and run the same command again (what was written is kept)"
    return text

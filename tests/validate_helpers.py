"""Helpers of the `validate` tests: a closed port (an unreachable URL), the tiny config on CPU
with its cache in the test's folder, and the problems a `validate` report lists."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tests.tiny_config import tiny_config


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, **changes: Any) -> Path:
    runtime = {"device": "cpu", "cache_dir": str(tmp_path / "cache")}
    return tiny_config(tmp_path, **{"runtime": runtime, **changes})


def problems_of(lines: list[str]) -> list[str]:
    start = lines.index(next(line for line in lines if line.startswith("problems (")))
    return [line.strip() for line in lines[start + 1 : -1]]

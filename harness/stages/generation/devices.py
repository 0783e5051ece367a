"""The GPUs this process may use, told without importing torch (the driver stays torch-free):
`CUDA_VISIBLE_DEVICES` read once here for the generation stage and `harness.cli.machine`."""

from __future__ import annotations

import os
from pathlib import Path


def visible_ids() -> list[str] | None:
    """The device ids `CUDA_VISIBLE_DEVICES` leaves this process: None when it is unset (every
    GPU), empty when it hides them all (empty, or "-1" first: CUDA stops at an invalid id)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    return [] if not ids or ids[0] == "-1" else ids


def visible_gpus(proc: str = "/proc/driver/nvidia/gpus") -> int:
    """NVIDIA GPUs this process may use, without importing torch.

    The NVIDIA kernel driver lists each GPU under `proc`; `CUDA_VISIBLE_DEVICES` narrows them
    (`visible_ids`). A machine with a GPU but a CPU-only torch build counts its GPU here: the
    in-process generator then runs on CPU with GPU-sized batches of `auto`.
    """
    root = Path(proc)
    try:
        count = sum(1 for _ in root.iterdir()) if root.is_dir() else 0
    except OSError:
        count = 0
    ids = visible_ids()
    return count if ids is None else min(count, len(ids))

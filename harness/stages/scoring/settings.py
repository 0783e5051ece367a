"""How the scoring stage places and supervises its actors, read from `runtime` and `scorers`
(`pool_settings`): the GPU budget and wait, call timeouts, chunk retries, per-scorer pools."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.scorers.score_buffer import FLUSH_ROWS


@dataclass(frozen=True)
class Share:
    """A scorer's actor pool from its config entry: `replicas`, GPUs per actor."""

    replicas: int | None = None
    num_gpus: float | None = None


@dataclass(frozen=True)
class PoolSettings:
    """How the scoring stage places and supervises its actors (from `runtime` and `scorers`)."""

    gpus: int | None = None  # GPU budget; None: the GPUs the cluster has
    gpu_wait_s: float = 900.0
    call_timeout_s: float = 600.0
    chunk_retries: int = 2
    shares: Mapping[str, Share] = field(default_factory=dict)
    flush_rows: int = FLUSH_ROWS  # score rows an actor holds before writing them as a shard


def pool_settings(cfg: Any) -> PoolSettings:
    """`PoolSettings` of a `harness.config.RunConfig`."""
    rt = cfg.runtime
    return PoolSettings(
        gpus=rt.gpus,
        gpu_wait_s=rt.gpu_wait_s,
        call_timeout_s=rt.score_call_timeout_s,
        chunk_retries=rt.score_chunk_retries,
        shares={s.name: Share(s.replicas, s.num_gpus) for s in cfg.scorers},
    )

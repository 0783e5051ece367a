"""Starting or attaching to Ray: in-process local mode, or the cluster a job runs in."""

from __future__ import annotations

import os
from typing import Any

# Before `import ray`: local Ray without token auth or usage reporting (docs/footguns.md).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402


def init_ray(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Attach to `address` (or $RAY_ADDRESS), else start a local Ray bound to 127.0.0.1.

    Local mode declares more logical CPUs than cores: actors holding one CPU each would
    otherwise starve every other task on a 2-core machine. Returns the cluster resources.
    """
    if ray.is_initialized():
        return dict(ray.cluster_resources())
    address = address or os.environ.get("RAY_ADDRESS")
    # The working directory goes to workers so `jobs`/`workers`/`results` import there.
    env = {"env_vars": {"RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"], "TOKENIZERS_PARALLELISM": "false"}}
    if address:
        ray.init(address=address, log_to_driver=True, runtime_env=env)
    else:
        cores = os.cpu_count() or 2
        ray.init(
            num_cpus=num_cpus or max(4, 2 * cores),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
            runtime_env=env,
        )
    return dict(ray.cluster_resources())


def shutdown_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()

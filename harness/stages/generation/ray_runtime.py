"""Starting or attaching to Ray (`init_ray`: docs/design.md, The generation stage), and what the
cluster holds. Ray is imported inside the functions: the loopback setting must be in the
environment before Ray reads its constants, and `status` should not pay for importing Ray."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("harness")

# The project's packages, shipped to workers when attaching from outside a Ray job.
PACKAGES = ("harness", "jobs", "results", "workers")
# Never uploaded with the code (see also .rayignore for `ray job submit --working-dir .`).
UPLOAD_EXCLUDES = ["__pycache__", "*.pyc", "*.parquet", ".mypy_cache", ".ruff_cache"]
# Set by Ray's job supervisor in the environment of a submitted job's entrypoint.
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def local_ray_env() -> None:
    """Environment for a local Ray that listens on 127.0.0.1 only: multi-node mode off (else
    Ray rewrites 127.0.0.1 to the outward address and listens everywhere), no token auth (it would
    write ~/.ray/auth_token), no usage stats."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if "ray._private.ray_constants" in sys.modules:  # Ray imported before us: same effect
        constants = sys.modules["ray._private.ray_constants"]
        if os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":
            constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


def code_runtime_env() -> dict[str, Any]:
    """Runtime env that ships this project's packages to every worker of the cluster, with
    the `--include` modules (their code and the variable naming them; see `include_env`)."""
    import importlib

    modules = [str(Path(importlib.import_module(p).__file__ or "").parent) for p in PACKAGES]
    env = include_env()
    modules += env.pop("py_modules", [])
    return {"py_modules": modules, "excludes": list(UPLOAD_EXCLUDES), **env}


def include_env() -> dict[str, Any]:
    """The runtime env part that makes `--include` modules reach workers on every node: the
    variable in `env_vars` (raylets start the workers, which inherit nothing from this process), and
    in `py_modules` each included module not installed in site-packages. Empty without `--include`."""
    import importlib.util

    from workers.plugins import INCLUDE_ENV

    names = [m for m in os.environ.get(INCLUDE_ENV, "").split(",") if m]
    if not names:
        return {}
    paths: list[str] = []
    for name in names:
        spec = importlib.util.find_spec(name.partition(".")[0])
        origin = spec.origin if spec is not None else None
        if not origin or origin in ("built-in", "frozen"):
            continue
        path = Path(origin)
        path = path.parent if path.name == "__init__.py" else path
        if not {"site-packages", "dist-packages"} & set(path.parts) and str(path) not in paths:
            paths.append(str(path))
    return {"env_vars": {INCLUDE_ENV: ",".join(names)}, "py_modules": paths}


_local_temp: list[str] = []  # the temp dir of the local Ray this process started
_command_handlers: dict[int, Any] = {}  # SIGINT/SIGTERM handlers in force before ray.init


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Put back the SIGINT/SIGTERM handlers installed before the block (`ray.init` sets its
    own SIGTERM one). Only in the main thread, where handlers can be set."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _command_handlers.clear()
    _command_handlers.update({s: h for s, h in before.items() if h is not None})
    try:
        yield
    finally:
        reassert_signal_handlers()


def forget_signal_handlers() -> None:
    """The command is over: `reassert_signal_handlers` has nothing to put back."""
    _command_handlers.clear()


def reassert_signal_handlers() -> None:
    """Put back the handlers `keep_signal_handlers` saw before Ray started, if anything (Ray
    again, a library) has replaced them since; the driver calls it as each stage starts."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for s, handler in _command_handlers.items():
        if signal.getsignal(s) is not handler:
            signal.signal(s, handler)


def init_ray(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Attach to the cluster (see the module docstring), else start a local Ray of our own;
    returns the cluster resources. A local Ray declares more logical CPUs than cores (2 per
    core, at least 4), so that one-CPU actors do not starve every other task on a small machine
    (ray-notes: Ray issue #44687); CPU replicas are sized by the cores themselves
    (`harness.stages.generation.cpu_sizing`), which stay within that count."""
    target = address or os.environ.get("RAY_ADDRESS") or None  # None: a local Ray of our own
    if target is None:
        local_ray_env()
    import ray

    if ray.is_initialized():
        return dict(ray.cluster_resources())
    with keep_signal_handlers():
        if target is not None and JOB_CONFIG_ENV in os.environ:  # the entrypoint of a Ray job
            # the job's runtime env (its working dir) carries the code; Ray merges these env vars
            env = {k: v for k, v in include_env().items() if k == "env_vars"}
            ray.init(address=target, log_to_driver=True, runtime_env=env or None)
        elif target is not None:
            ray.init(address=target, log_to_driver=True, runtime_env=code_runtime_env())
        else:
            cores = os.cpu_count() or 2
            # address="local": never the cluster `ray start` recorded in the default temp dir;
            # a temp dir of our own: that cluster's `session_latest` stays its own. Short: Ray's
            # socket paths under it are limited to ~107 characters (not $TMPDIR, often long).
            base = os.environ.get("RAY_TMPDIR") or "/tmp"  # where Ray's own would go
            os.makedirs(base, exist_ok=True)
            temp = tempfile.mkdtemp(prefix="lidao-ray-", dir=base)
            _local_temp.append(temp)
            ray.init(
                address="local",
                num_cpus=num_cpus or max(4, 2 * cores),
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=temp,
                log_to_driver=True,
            )
    resources = dict(ray.cluster_resources())
    where = "local Ray" if target is None else f"Ray cluster at {target}"
    short = [f"{k} {resources[k]:g}" for k in ("CPU", "GPU") if k in resources]
    short += [f"memory {resources['memory'] / 2**30:.0f} GiB"] if "memory" in resources else []
    if target is None:  # Ray's CPUs are a count of slots, not the cores replicas are sized by
        given = "runtime.num_cpus" if num_cpus else "2 per core, at least 4"
        short[0] += f" logical ({given}; {os.cpu_count() or 1} cores)"
    log.info("%s: %d node(s), %s", where, alive_nodes(), ", ".join(short))
    return resources


def alive_nodes() -> int:
    """Number of live nodes of the attached cluster."""
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def shutdown_ray() -> None:
    """Disconnect (attached) or stop (local) Ray, if this process started it; remove the temp
    dir of a local Ray `init_ray` started; forget the command's signal handlers."""
    forget_signal_handlers()
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    while _local_temp:
        shutil.rmtree(_local_temp.pop(), ignore_errors=True)


def cluster_mode() -> bool:
    """True when attached to a cluster this process did not start (nodes may join later);
    a local Ray started here holds its head node in this process."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # noqa: SLF001 - no public API
    return node is None or not bool(getattr(node, "head", False))


_most_gpus: dict[str, float] = {}  # GCS address → the most GPUs this process saw it hold


def cluster_gpus() -> float:
    """GPUs of the live nodes of the attached cluster (logical GPUs count)."""
    import ray

    have = float(ray.cluster_resources().get("GPU", 0))
    key = ray.get_runtime_context().gcs_address
    _most_gpus[key] = max(_most_gpus.get(key, 0.0), have)
    return have


def lost_gpus() -> float:
    """GPUs the attached cluster held earlier in this process and holds no more (nodes lost)."""
    import ray

    have = cluster_gpus()
    return max(0.0, _most_gpus[ray.get_runtime_context().gcs_address] - have)

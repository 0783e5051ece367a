"""This machine, for `harness.cli.preflight`: the GPUs a local run can use, counted without
importing torch in this process, and whether the run directory can be written."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from harness.cli.preflight import Item
from harness.config import RunConfig
from harness.stages.generation.devices import visible_ids
from jobs.files import os_problem
from jobs.redact import has_controls, printable


@functools.cache
def local_gpus() -> tuple[int, str]:
    """(CUDA devices this machine gives torch, why none), without importing torch here: the
    torch build and the driver are looked at first; only when both are there does a short
    subprocess ask torch (it honours CUDA_VISIBLE_DEVICES). Once per process."""
    spec = importlib.util.find_spec("torch")
    lib = Path(next(iter(spec.submodule_search_locations or []), "")) / "lib" if spec else None
    if visible_ids() == []:
        found = (0, "CUDA_VISIBLE_DEVICES hides every GPU")
    elif lib is None:
        found = (0, "torch is not installed")
    elif not any(lib.glob("libtorch_cuda*")) and not any(lib.glob("libtorch_hip*")):
        found = (0, "this torch is a CPU-only build")
    elif (
        not (Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi"))
        and not Path("/dev/kfd").exists()
    ):
        found = (0, "no GPU driver on this machine")
    else:
        code = "import torch; print(torch.cuda.device_count())"
        try:
            res = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
            )
            n = int(res.stdout.strip().splitlines()[-1])
            found = (n, "" if n else "torch sees no CUDA device")
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
            found = (0, f"counting GPUs failed ({exc})")
    return found


def check_devices(cfg: RunConfig, local: bool) -> list[Item]:
    """`runtime.device` and GPU requests against this machine (a local run only: on a cluster
    the nodes hold the GPUs and the run waits for them)."""
    rt = cfg.runtime
    asks = [
        (f"models.{i}.num_gpus", m.num_gpus or 0.0, m.replicas or 1)
        for i, m in enumerate(cfg.models)
    ]
    asks += [
        (f"scorers.{k}.num_gpus", s.num_gpus or 0.0, s.replicas or 1)
        for k, s in enumerate(cfg.scorers)
    ]
    wants_cuda = bool(rt.device and rt.device.startswith("cuda"))
    if not local:
        return [Item("runtime.device", rt.device or "default", "on the cluster's nodes")]
    if not wants_cuda and not any(g for _, g, _ in asks):
        return [
            Item("runtime.device", rt.device or "default", "cpu" if rt.device == "cpu" else "local")
        ]
    n, why = local_gpus()
    items = []
    if wants_cuda:
        assert rt.device is not None
        index = rt.device.partition(":")[2]
        if n == 0:
            problem = f"{rt.device} asked, but {why}; set runtime.device: cpu (or --device cpu)"
        elif index.isdigit() and int(index) >= n:
            problem = f"{rt.device} asked, but this machine has {n} GPU(s) (cuda:0..cuda:{n - 1})"
        else:
            problem = None
        items.append(Item("runtime.device", rt.device, f"{n} local GPU(s)", problem))
    for field, share, replicas in asks:
        if not share:
            continue
        need = share * replicas if share >= 1 else share
        if n == 0:
            problem = f"{share:g} GPU(s) asked, but {why}"
        elif need > n:
            problem = (
                f"{need:g} GPU(s) asked ({replicas} replica(s) × {share:g}), this machine has {n}"
            )
        else:
            problem = None
        items.append(Item(field, f"{share:g}", f"{n} local GPU(s)", problem))
    return items


def check_output(out: str) -> Item:
    """`--out` can be written: a local folder (or where one can be made), or a pyarrow URI
    (a probe object written and deleted)."""
    if has_controls(out) or "\n" in out or "\t" in out:
        return Item(
            "--out",
            out,
            "name",
            f"{printable(out)!r} holds a control character (a newline, a tab...); every path "
            "of the run would hold it: give a plain name",
        )
    if "://" in out:
        try:
            import pyarrow.fs as pafs

            fs, root = pafs.FileSystem.from_uri(out)
            if fs.get_file_info(root).type == pafs.FileType.File:
                return Item("--out", out, "URI", f"{out} is a file, not a run directory")
            folder = root.rstrip("/")
            while True:  # object stores take a key under any prefix; others need the folder
                probe = f"{folder}/.lidao-write-probe-{uuid.uuid4().hex[:12]}".lstrip("/")
                try:
                    with fs.open_output_stream(probe) as stream:
                        stream.write(b"")
                    break
                except FileNotFoundError:
                    if not folder:
                        raise
                    folder = folder.rsplit("/", 1)[0] if "/" in folder else ""
            fs.delete_file(probe)
        except Exception as exc:  # noqa: BLE001 - any failure means the run could not write
            return Item("--out", out, "URI", f"{out}: cannot write ({str(exc).splitlines()[0]})")
        return Item("--out", out, "writable")
    path = Path(out).expanduser().absolute()
    try:
        exists = path.exists()
    except OSError as exc:  # a name too long: nothing of the run could be written there
        return Item("--out", out, "local", os_problem(path, exc))
    if exists and not path.is_dir():
        return Item("--out", out, "local", f"{path} exists and is not a folder")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return Item("--out", out, "local", f"{parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        return Item("--out", out, "local", f"{parent} is not writable")
    return Item("--out", out, "writable")


CLUSTER_TIMEOUT_S = 3.0


def check_cluster(cfg: RunConfig, use_ray: bool = True) -> list[Item]:
    """The cluster an attached run names (`runtime.ray_address` / `--address`, else
    `RAY_ADDRESS`) answers on its port: otherwise `ray.init` waits on it for minutes, printing
    only Ray's own retries. `auto` (Ray's address file) is left to Ray."""
    if not use_ray:
        return []
    field = "runtime.ray_address" if cfg.runtime.ray_address else "RAY_ADDRESS"
    address = cfg.runtime.ray_address or os.environ.get("RAY_ADDRESS") or ""
    hostport = address.split("://", 1)[-1].strip().rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not address or hostport in ("auto", "local") or not host or not port.isdigit():
        return []
    import socket

    try:
        with socket.create_connection((host.strip("[]"), int(port)), CLUSTER_TIMEOUT_S):
            pass
    except OSError as exc:
        timed_out = isinstance(exc, TimeoutError)
        why = f"no answer in {CLUSTER_TIMEOUT_S:g} s" if timed_out else exc.strerror or str(exc)
        unset = "unset RAY_ADDRESS" if field == "RAY_ADDRESS" else "drop --address"
        return [
            Item(
                field,
                address,
                "NOT REACHABLE",
                f"{address}: no Ray cluster answers ({why}); "
                f"start it or name the right address, or {unset} for a local run",
            )
        ]
    return [Item(field, address, "reachable")]


def is_local_run(cfg: RunConfig, use_ray: bool = True) -> bool:
    """The run's actors are on this machine: no Ray, or no cluster address."""
    return not use_ray or not (cfg.runtime.ray_address or os.environ.get("RAY_ADDRESS"))

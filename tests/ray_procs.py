"""Process helpers for tests that start Ray themselves: free ports, the processes of one
cluster (found by its temp dir or GCS address, with their descendants), stopping them by PID
(never `ray stop`, which would kill every Ray on the machine), and the addresses they listen on;
`local_cluster`, a multi-node `ray.cluster_utils.Cluster` on 127.0.0.1.

Linux only: reads /proc.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def local_cluster(prefix: str, node_gpus: Iterable[int] = ()) -> Iterator[Any]:
    """A `ray.cluster_utils.Cluster` on 127.0.0.1, `ray` connected to it: a CPU-only head (one
    CPU, no dashboard) and a node of 2 CPUs per entry of `node_gpus` (its logical GPUs). A
    session-wide local Ray from another module is shut down first; at the end Ray and the
    cluster are shut down and the temp dir (`prefix`, under /tmp) removed."""
    import ray
    from ray.cluster_utils import Cluster

    from harness.stages.generation.ray_runtime import local_ray_env

    local_ray_env()  # 127.0.0.1 only, no token auth (conftest set it before Ray was imported)
    if ray.is_initialized():  # a session-wide local Ray from another module: this one needs its own
        ray.shutdown()
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: unix socket paths are limited
    head = {"num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "temp_dir": tmp}
    # `Cluster` records its address in $RAY_TMPDIR/ray (else $TMPDIR/ray, else /tmp/ray), a
    # folder it does not create: on a fresh machine there is none (FileNotFoundError), and on
    # a shared one the record would send everyone's plain `ray.init()` to this cluster.
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"))
    c = None
    # Cluster writes its address to <RAY_TMPDIR or /tmp>/ray/ray_current_cluster: here, not in
    # a /tmp/ray that may be missing (a fresh machine) or another cluster's
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"), exist_ok=True)
    try:
        c = Cluster(initialize_head=True, head_node_args=head)
        for gpus in node_gpus:
            c.add_node(num_cpus=2, num_gpus=gpus)
        ray.init(address=c.address)
        yield c
    finally:
        ray.shutdown()
        if c is not None:
            c.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(tmp, ignore_errors=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _processes() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, command line) of every process we can read."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces
        out[int(entry.name)] = (ppid, cmd)
    return out


def process_tree(tags: Iterable[str] = (), roots: Iterable[int] = ()) -> set[int]:
    """PIDs whose command line holds one of `tags`, or listed in `roots`, and all descendants."""
    procs = _processes()
    me = os.getpid()
    found = {p for p, (_, cmd) in procs.items() if p != me and any(t in cmd for t in tags)}
    found |= {p for p in roots if p in procs}
    grew = True
    while grew:
        children = {p for p, (ppid, _) in procs.items() if ppid in found and p not in found}
        found |= children
        grew = bool(children)
    return found


def stop_processes(pids: set[int], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.time() + grace_s
        while sig == signal.SIGTERM and time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether `pid` runs (an exited process not yet reaped, a zombie, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _decode(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # IPv6: four little-endian 32-bit words
        ip = socket.inet_ntop(
            socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        )
    return f"{ip}:{int(port, 16)}"


def listening_addresses(pids: set[int]) -> set[str]:
    """host:port of every TCP socket in LISTEN state held by `pids`."""
    inodes = set().union(*(_socket_inodes(p) for p in pids)) if pids else set()
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.add(_decode(fields[1]))
    return out


def loopback_only(addresses: set[str]) -> bool:
    return all(a.startswith(("127.0.0.1:", "::1:", "::ffff:127.0.0.1:")) for a in addresses)

"""The campaign's machinery: a trial (setup, command, expected outcome), the `harness` CLI run as
a user runs it (a child `python -m harness` with fresh HOME / TMPDIR / caches), and the checks
every trial shares: no traceback and no secret in anything printed, every job exactly once."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PAIRS = REPO / "examples" / "data"
SECRET = "AIzaSy-campaign-secret-0123456789"  # the Perspective key: must never be printed or stored


class TrialFailed(AssertionError):
    """An expectation of a trial did not hold."""


@dataclass
class Result:
    """One CLI invocation: its exit code and what it printed."""

    args: list[str]
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err

    def show(self) -> str:
        tail = self.text[-900:].replace("\n", "\n    | ")
        return f"`{' '.join(self.args)}` -> rc {self.rc}\n    | {tail}"


@dataclass
class Trial:
    """A setup, one or more commands and the expected outcome, as a function of a `Ctx`."""

    kind: str
    name: str
    fn: Callable[[Ctx], None]
    ray: bool = False  # starts a local Ray: skipped by --no-ray-trials


TRIALS: list[Trial] = []
RUN_CONFIGS: dict[str, Callable[[], dict[str, Any]]] = {}  # cached runs' configs, by name


def trial(kind: str, name: str, *, ray: bool = False) -> Callable[[Callable[[Ctx], None]], Any]:
    """Register the decorated function as a trial."""

    def add(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        TRIALS.append(Trial(kind, name, fn, ray))
        return fn

    return add


def base_config(**changes: Any) -> dict[str, Any]:
    """Two pairs of the example prompts on tiny GPT-2, vanilla and LIDAO-min, gender and VADER,
    2 samples of 4 tokens, small resampling counts: a run of 16 jobs."""
    cfg: dict[str, Any] = {
        "name": "campaign",
        "dataset": {
            "kind": "paired-jsonl",
            "files": {g: str(PAIRS / f"pairs-{g}.jsonl") for g in ("female", "male")},
            "limit": 2,
        },
        "models": [{"id": "tiny-random/gpt2"}],
        "methods": ["vanilla", "lidao-min"],
        "tasks": ["sentiment"],
        "samples_per_prompt": 2,
        "generation": {"max_new_tokens": 4},
        "scorers": ["gender", "sentiment-vader"],
        "runtime": {"device": "cpu"},
        "aggregation": {"n_boot": 50, "n_perm": 20},
    }
    for key, value in changes.items():
        put(cfg, key, value)
    return cfg


def put(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.0.c` in a nested dict / list (a list index as a number); `DELETE` removes it."""
    *parents, last = dotted.split(".")
    node: Any = cfg
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if value is DELETE:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


DELETE = object()


@dataclass
class Ctx:
    """One trial's folder and environment, and the campaign's shared, cached runs."""

    root: Path  # the campaign's work folder
    dir: Path  # this trial's folder (empty at the start)
    env: dict[str, str]
    shared: dict[str, Any]
    results: list[Result] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # printed beside the trial's line

    # ---- running the CLI -------------------------------------------------------------------
    def popen(
        self, *args: str, cwd: Path | None = None, prefix: tuple[str, ...] = (), **env: str
    ) -> subprocess.Popen[str]:
        cmd = [*prefix, sys.executable, "-m", "harness", *args]
        # this checkout's harness, not an editable install's (which may be another worktree);
        # a trial's own PYTHONPATH (a plugin's folder) comes first
        path = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)
        return subprocess.Popen(
            cmd,
            cwd=cwd or self.dir,
            env={**self.env, **env, "PYTHONPATH": path},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its process group: what it leaves behind can be found
        )

    def cli(
        self,
        *args: str | Path,
        cwd: Path | None = None,
        timeout: float = 420,
        prefix: tuple[str, ...] = (),
        **env: str,
    ) -> Result:
        """`python -m harness ARGS` in a child process (cwd: the trial's folder), after
        `prefix` (a command that runs the rest)."""
        strs = [str(a) for a in args]
        proc = self.popen(*strs, cwd=cwd, prefix=prefix, **env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            out, err = proc.communicate()
            res = Result(strs, -999, out, err + f"\n[campaign: timed out after {timeout} s]")
            self.results.append(res)
            raise TrialFailed(f"hung: {res.show()}") from None
        res = Result(strs, proc.returncode, out, err)
        self.results.append(res)
        return res

    def expect(self, res: Result, rc: int | Iterable[int], *needles: str, absent: str = "") -> None:
        """`res` exited `rc` and printed every needle (and not `absent`)."""
        codes = {rc} if isinstance(rc, int) else set(rc)
        missing = [n for n in needles if n not in res.text]
        if res.rc not in codes or missing or (absent and absent in res.text):
            why = f"wanted rc {sorted(codes)}" + (f" and {missing}" if missing else "")
            why += f" without {absent!r}" if absent and absent in res.text else ""
            raise TrialFailed(f"{why}; got {res.show()}")

    # ---- files -----------------------------------------------------------------------------
    def config(
        self, data: dict[str, Any] | str, name: str = "c.yaml", where: Path | None = None
    ) -> Path:
        path = (where or self.dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            path.write_text(data, encoding="utf-8")
        else:
            text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
            path.write_text(re.sub(r"'<<(.*?)>>'", r"\1", text), encoding="utf-8")  # raw YAML
        return path

    def copy_run(self, which: str = "base") -> Path:
        """A copy of a cached run (`base`: `base_config()` run in-process)."""
        src = self.cached_run(which)
        dst = self.dir / "run"
        shutil.copytree(src, dst, symlinks=True)
        return dst

    def cached_run(self, which: str) -> Path:
        if which not in self.shared:
            where = self.root / "cached" / which
            shutil.rmtree(where, ignore_errors=True)
            path = self.config(RUN_CONFIGS[which](), where=where)
            res = self.cli("run", path, "--out", where / "run", "--no-ray", "--no-progress")
            self.expect(res, 0)
            self.shared[which] = where / "run"
        return Path(self.shared[which])

    def check_run(
        self, run: Path, jobs: int | None = None, scorers: Iterable[str] = (), outside: bool = False
    ) -> dict[str, str]:
        """Every planned job has one ok generation row (none outside the plan unless
        `outside`: a --replan keeps the old rows) and one ok score row per scorer, as every
        reader counts them: by job id. A job stored twice must have the same text both times
        (a compaction killed while deleting its inputs leaves its rows twice on disk; the
        next compaction never merges `part-c-` shards): noted. Returns job id → text."""
        planned = set(read_column(run / "plan.parquet", "job_id"))
        if jobs is not None and len(planned) != jobs:
            raise TrialFailed(f"{run}: {len(planned)} jobs planned, wanted {jobs}")
        _, ok = rows_of(run / "generations", ("job_id", "status", "continuation"))
        texts: dict[str, set[str]] = {}
        for r in ok:
            if not outside or r["job_id"] in planned:
                texts.setdefault(r["job_id"], set()).add(r["continuation"])
        twice = sum(Counter(r["job_id"] for r in ok).get(j, 0) > 1 for j in planned)
        differ = [j for j, t in texts.items() if len(t) > 1]
        lacking, foreign = planned - set(texts), set(texts) - planned
        if differ or lacking or foreign:
            raise TrialFailed(
                f"{run}: {len(differ)} jobs stored twice with different texts, {len(lacking)} "
                f"missing, {len(foreign)} outside the plan (of {len(planned)})"
            )
        if twice:
            self.notes.append(f"{twice} jobs stored twice on disk, identical")
        for name in scorers:
            _, scored = rows_of(run / "scores" / name, ("job_id", "status", "scorer_version"))
            if {r["job_id"] for r in scored} != planned:
                got = len({r["job_id"] for r in scored})
                raise TrialFailed(f"{run}: scorer {name}: {got} jobs scored of {len(planned)}")
        return {j: next(iter(t)) for j, t in texts.items()}

    def check_secret(self, folder: Path) -> None:
        """No file under `folder` holds the Perspective key."""
        for path in folder.rglob("*"):
            if path.is_file() and SECRET.encode() in path.read_bytes():
                raise TrialFailed(f"the API key is stored in {path}")


def read_column(path: Path, column: str) -> list[Any]:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=[column]).column(column).to_pylist()


def rows_of(
    folder: Path, columns: tuple[str, ...]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every row, the ok rows) of the Parquet shards under `folder`, as stored."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    shards = [p for p in folder.rglob("*.parquet") if not p.name.startswith(".")]  # not temps
    for shard in sorted(shards) if folder.is_dir() else []:
        rows += pq.read_table(shard, columns=list(columns)).to_pylist()
    return rows, [r for r in rows if r["status"] == "ok"]


def descendants(pid: int) -> list[int]:
    """`pid`'s process tree (children first found through /proc), `pid` included."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def kill_tree(pid: int, tree: Iterable[int] = ()) -> None:
    """SIGKILL `pid`, its tree now and `tree` (found earlier): only processes this campaign
    started, each by its id."""
    import signal

    for p in {*descendants(pid), *tree}:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return False


def jsonl(path: Path, records: Iterable[Any]) -> Path:
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8"
    )
    return path

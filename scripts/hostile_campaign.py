"""The hostile campaign of issue 29: a user's worst first hour, through the CLI, as trials.

Each trial is a setup (configs, data files, run directories, a fake Perspective endpoint, a
plugin), one or more `python -m harness ...` commands in child processes, and the expected
outcome as assertions: the exit code, a message naming the field / file / line / option, and
data checks (every planned job exactly once, texts identical after a kill and a re-run, rows
recovered by a plain `score`). Every command of every trial is also checked for a "Traceback"
and for the Perspective key in what it printed.

The children run on the tiny offline models with HOME, TMPDIR, XDG_CACHE_HOME, HF_HOME and
MPLCONFIGDIR fresh folders under the work folder, and OMP_NUM_THREADS=1 (a shared 2-core
machine). Most runs are in-process (`--no-ray`); trials marked Ray start a local Ray each.

    .venv/bin/python scripts/hostile_campaign.py                 # every trial (~40 min, 2 cores)
    .venv/bin/python scripts/hostile_campaign.py --only kill     # trials whose kind/name match
    .venv/bin/python scripts/hostile_campaign.py --list

It prints a line per trial and a table of trials by kind; exit 1 when a trial failed. The
trials: scripts/campaign/t_*.py. Results: docs/footguns.md, "Configs".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from campaign import (  # noqa: E402 - the trial modules register themselves on import
    t_configs,
    t_data,
    t_inject,
    t_kills,
    t_modes,
    t_paths,
    t_plugins,
    t_rundirs,
    t_scorers,
)
from campaign.core import SECRET, TRIALS, Ctx, Result, Trial, TrialFailed  # noqa: E402

MODULES = (t_configs, t_data, t_inject, t_paths, t_rundirs, t_scorers, t_plugins, t_modes, t_kills)


def fresh_env(root: Path) -> dict[str, str]:
    """A new user's environment: empty HOME, TMPDIR and caches; no Ray address, key or proxy."""
    dirs = {k: root / "env" / k.lower() for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TERM") if k in os.environ}
    env.update({k: str(v) for k, v in dirs.items()})
    cache = dirs["XDG_CACHE_HOME"]
    env |= {"HF_HOME": str(cache / "huggingface"), "MPLCONFIGDIR": str(cache / "matplotlib")}
    env |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return env


def problems(res: Result) -> list[str]:
    """What no command may print, whatever its exit code."""
    found = []
    if "Traceback" in res.text:
        found.append(f"a traceback: {res.show()}")
    if SECRET in res.text:
        found.append(f"the API key printed: `{' '.join(res.args)}`")
    return found


def run_trial(t: Trial, root: Path, n: int, env: dict[str, str], shared: dict) -> dict:
    folder = root / "trials" / f"{n:03d}-{t.kind}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ctx = Ctx(root, folder, dict(env), shared)
    start = time.monotonic()
    try:
        t.fn(ctx)
        failure = "; ".join(p for r in ctx.results for p in problems(r))
    except TrialFailed as exc:
        failure = str(exc)
    except Exception:  # the campaign's own error: reported as a failure, never hidden
        failure = "campaign error: " + traceback.format_exc(limit=4)
    extra = [p for r in ctx.results for p in problems(r)]
    if extra and extra[0] not in failure:
        failure = "; ".join([failure, *extra]) if failure else "; ".join(extra)
    return {
        "n": n,
        "kind": t.kind,
        "name": t.name,
        "ok": not failure,
        "failure": failure,
        "commands": len(ctx.results),
        "notes": ctx.notes,
        "seconds": round(time.monotonic() - start, 1),
    }


def table(records: list[dict]) -> str:
    kinds = Counter(r["kind"] for r in records)
    passed = Counter(r["kind"] for r in records if r["ok"])
    lines = ["| kind | trials | passed | failed |", "|---|---|---|---|"]
    for kind in sorted(kinds):
        lines.append(f"| {kind} | {kinds[kind]} | {passed[kind]} | {kinds[kind] - passed[kind]} |")
    total, ok = len(records), sum(r["ok"] for r in records)
    lines.append(f"| all | {total} | {ok} | {total - ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], help="kind or name substring")
    p.add_argument("--no-ray-trials", action="store_true", help="skip trials that start Ray")
    p.add_argument(
        "--workdir", help="work folder (default: a new temp folder, removed if all pass)"
    )
    p.add_argument("--list", action="store_true", help="list the trials and exit")
    args = p.parse_args(argv)
    assert len(MODULES) == 9
    chosen = [
        t
        for t in TRIALS
        if (not args.only or any(o in f"{t.kind}/{t.name}" for o in args.only))
        and not (t.ray and args.no_ray_trials)
    ]
    if args.list:
        print("\n".join(f"{t.kind:10} {t.name}" + ("  [ray]" if t.ray else "") for t in chosen))
        print(f"{len(chosen)} trials")
        return 0
    root = Path(args.workdir or tempfile.mkdtemp(prefix="campaign-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    env, shared, records = fresh_env(root), {}, []
    print(f"{len(chosen)} trials in {root}", flush=True)
    for n, t in enumerate(chosen, 1):
        rec = run_trial(t, root, n, env, shared)
        records.append(rec)
        mark = "ok  " if rec["ok"] else "FAIL"
        notes = f" [{'; '.join(rec['notes'])}]" if rec["notes"] else ""
        print(f"{mark} {n:3d} {t.kind}/{t.name} ({rec['seconds']} s){notes}", flush=True)
        if not rec["ok"]:
            print("     " + rec["failure"].replace("\n", "\n     "), flush=True)
    (root / "results.json").write_text(json.dumps(records, indent=1))
    print(table(records))
    failed = [r for r in records if not r["ok"]]
    if not failed and not args.workdir:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

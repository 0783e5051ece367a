"""Run directories: torn and garbage shards, a lost or damaged plan, an edited / broken / lost
config.yaml, a damaged manifest and history, a held lock, two drivers at once, a changed config,
a read-only directory, folders that are not runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from campaign.core import Ctx, Result, TrialFailed, base_config, trial

SCORERS = ["gender", "sentiment-vader"]


def base(ctx: Ctx) -> tuple[Path, Path, dict[str, str]]:
    """(a copy of the base run, the config it was run from, its texts)."""
    run = ctx.copy_run()
    texts = ctx.check_run(run, 16, SCORERS)
    return run, ctx.config(base_config()), texts


def rerun(ctx: Ctx, cfg: Path, run: Path, texts: dict[str, str], *args: str) -> None:
    """`run` again: every job exactly once, scored, with the texts the first run made."""
    ctx.expect(ctx.cli("run", cfg, "--out", run, "--no-ray", "--no-progress", *args), 0)
    again = ctx.check_run(run, len(texts), SCORERS)
    if again != texts:
        changed = sum(again.get(k) != v for k, v in texts.items())
        raise TrialFailed(f"{changed} of {len(texts)} texts changed after the re-run")


def shard(run: Path, stage: str = "generations") -> Path:
    return sorted((run / stage).rglob("*.parquet"))[0]


@trial("rundirs", "a torn generation shard is quarantined and regenerated")
def torn_generation(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    path = shard(run)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    ctx.expect(ctx.cli("status", run), 0, "quarantined")
    rerun(ctx, cfg, run, texts)


@trial("rundirs", "a garbage generation shard is quarantined and regenerated")
def garbage_generation(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    (run / "generations" / "part-0123456789abcdef01234567.parquet").write_bytes(b"PAR1garbagePAR1")
    rerun(ctx, cfg, run, texts)


@trial("rundirs", "a torn score shard is scored again by a plain score")
def torn_score(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    path = shard(run, "scores/gender")
    path.write_bytes(path.read_bytes()[:100])
    ctx.expect(ctx.cli("score", run, "--no-ray"), 0)
    ctx.check_run(run, 16, SCORERS)


@trial("rundirs", "an unfinished temp shard left by a kill")
def temp_left(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    (run / "generations" / ".tmp-deadbeef-part-00.parquet").write_bytes(b"PAR1\0\0")
    ctx.expect(ctx.cli("status", run), 0, "planned 8, done 8")
    rerun(ctx, cfg, run, texts)


@trial("rundirs", "plan.parquet deleted: score / aggregate refuse, run writes it again")
def plan_deleted(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    (run / "plan.parquet").unlink()
    ctx.expect(ctx.cli("score", run, "--no-ray"), 2, "plan.parquet")
    ctx.expect(ctx.cli("aggregate", run), 2, "plan.parquet")
    rerun(ctx, cfg, run, texts)


@trial("rundirs", "plan.parquet garbage: named, never quarantined")
def plan_garbage(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    (run / "plan.parquet").write_bytes(b"not parquet at all")
    for cmd in (["status", run], ["aggregate", run], ["samples", run], ["score", run, "--no-ray"]):
        ctx.expect(ctx.cli(*cmd), 2, "plan.parquet")
    if (run / "quarantine").exists() and any((run / "quarantine").rglob("plan*")):
        raise TrialFailed("the plan was quarantined")


@trial("rundirs", "config.yaml edited: refused naming the field and the command")
def config_edited(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["samples_per_prompt"] = 3
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    for cmd in (["aggregate", run], ["score", run, "--no-ray"]):
        ctx.expect(ctx.cli(*cmd), 2, "samples_per_prompt", "config.yaml")


@trial("rundirs", "config.yaml not YAML: one line naming the file and line")
def config_broken(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    with (run / "config.yaml").open("a") as fh:
        fh.write("\nmethods: [unclosed\n")
    for cmd in (["aggregate", run], ["score", run, "--no-ray"], ["status", run], ["samples", run]):
        res = ctx.cli(*cmd)
        if res.rc != 0:
            ctx.expect(res, 2, "config.yaml", "line")


@trial("rundirs", "config.yaml deleted")
def config_deleted(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    (run / "config.yaml").unlink()
    ctx.expect(ctx.cli("aggregate", run), 0, "no config.yaml")  # documented: the labels seen
    ctx.expect(ctx.cli("score", run, "--no-ray"), 2, "config.yaml")
    rerun(ctx, cfg, run, texts)


@trial("rundirs", "config.yaml's scorer parameters edited: allowed")
def config_scorers(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["aggregation"]["n_boot"] = 20
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    ctx.expect(ctx.cli("aggregate", run), 0)


@trial("rundirs", "manifest.json and history.jsonl damaged")
def manifest_damaged(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    (run / "manifest.json").write_text("{truncated")
    with (run / "history.jsonl").open("a") as fh:
        fh.write('{"half a line\n\x00\x00\n')
    ctx.expect(ctx.cli("status", run), 0)
    rerun(ctx, cfg, run, texts)
    ctx.expect(ctx.cli("aggregate", run), 0)


@trial("rundirs", "summary.parquet deleted, then aggregate")
def summary_deleted(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    (run / "summary.parquet").unlink()
    ctx.expect(ctx.cli("status", run), 0, "summary.parquet")
    ctx.expect(ctx.cli("aggregate", run), 0)
    if not (run / "summary.parquet").is_file():
        raise TrialFailed("aggregate wrote no summary.parquet")


@trial("rundirs", "a scores folder of an unknown scorer")
def unknown_scores(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    (run / "scores" / "mystery").mkdir()
    (run / "scores" / "mystery" / "part-x.parquet").write_bytes(b"junk")
    for cmd in (["status", run], ["aggregate", run], ["samples", run]):
        ctx.expect(ctx.cli(*cmd), (0, 2))


@trial("rundirs", "generations deleted: pending, then regenerated identically")
def generations_deleted(ctx: Ctx) -> None:
    run, cfg, texts = base(ctx)
    for path in (run / "generations").rglob("*.parquet"):
        path.unlink()
    ctx.expect(ctx.cli("status", run), 0, "pending 8")
    rerun(ctx, cfg, run, texts)


@trial("rundirs", "a held lock: a second driver exits 2 naming it")
def held_lock(ctx: Ctx) -> None:
    run, cfg, _ = base(ctx)
    code = "import fcntl,sys,time; f=open(sys.argv[1],'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(run / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        ctx.expect(ctx.cli("run", cfg, "--out", run, "--no-ray"), 2, "in use")
        ctx.expect(ctx.cli("aggregate", run), 2, "in use")
        ctx.expect(ctx.cli("status", run), 0)  # reading needs no lock
    finally:
        holder.kill()
        holder.wait()


@trial("rundirs", "two drivers started at once on one run directory")
def two_drivers(ctx: Ctx) -> None:
    cfg = ctx.config(base_config(methods=["vanilla"]))
    procs = [
        ctx.popen("run", str(cfg), "--out", "run", "--no-ray", "--no-progress") for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    codes = sorted(p.returncode for p in procs)
    for p, (out, err) in zip(procs, outs, strict=True):
        ctx.results.append(Result(["run (one of two)"], p.returncode, out, err))
    if codes not in ([0, 0], [0, 2]):
        raise TrialFailed(f"two drivers: exit codes {codes}")
    ctx.check_run(ctx.dir / "run", 8, SCORERS)


@trial("rundirs", "a changed config: refused naming the field; --replan")
def changed_config(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    cfg = ctx.config(base_config(**{"generation.max_new_tokens": 5}), "c5.yaml")
    ctx.expect(
        ctx.cli("run", cfg, "--out", run, "--no-ray"), 2, "generation.max_new_tokens", "--replan"
    )
    ctx.expect(ctx.cli("run", cfg, "--out", run, "--no-ray", "--no-progress", "--replan"), 0)
    ctx.check_run(run, 16, outside=True)
    ctx.expect(ctx.cli("status", run), 0, "planned 8, done 8", "outside the current plan")


@trial("rundirs", "an extended config keeps the old rows")
def extended(ctx: Ctx) -> None:
    run, _, texts = base(ctx)
    cfg = ctx.config(base_config(methods=["vanilla", "lidao-min", "lidao-prod"]), "c3.yaml")
    ctx.expect(ctx.cli("run", cfg, "--out", run, "--no-ray", "--no-progress"), 0)
    again = ctx.check_run(run, 24, SCORERS)
    if any(again[k] != v for k, v in texts.items()):
        raise TrialFailed("extending the plan changed old texts")


@trial("rundirs", "a read-only run directory")
def read_only(ctx: Ctx) -> None:
    run, cfg, _ = base(ctx)
    for path in (run / "generations").rglob("*.parquet"):
        path.unlink()
    ro = ("unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(run))
    res = ctx.cli("run", cfg, "--out", run, "--no-ray", "--no-progress", prefix=ro)
    ctx.expect(res, (1, 2), str(run))
    ctx.expect(ctx.cli("status", run, prefix=ro), 0, "pending 8")
    ctx.expect(ctx.cli("samples", run, prefix=ro), 2, "no generations yet")


def _not_a_run(name: str, make: str, cmds: tuple[str, ...]) -> None:
    @trial("rundirs", f"not a run: {name}")
    def check(ctx: Ctx) -> None:
        folder = ctx.dir / "folder"
        if make == "empty":
            folder.mkdir()
        elif make == "file":
            folder.write_text("x")
        elif make == "other":
            folder.mkdir()
            (folder / "notes.txt").write_text("hello")
        for cmd in cmds:
            extra = {"score": ["--no-ray"], "compare": [str(folder)], "power": ["--gap", "5"]}.get(
                cmd, []
            )
            ctx.expect(ctx.cli(cmd, folder, *extra), 2, "folder")


ALL = ("status", "score", "aggregate", "samples", "compare", "power")
_not_a_run("missing folder", "", ALL)
_not_a_run("empty folder", "empty", ALL)
_not_a_run("a file", "file", ALL)
_not_a_run("a folder of notes", "other", ALL)


@trial("rundirs", "score on a plan without generations")
def plan_only(ctx: Ctx) -> None:
    run, _, _ = base(ctx)
    for path in (run / "generations").rglob("*.parquet"):
        path.unlink()
    ctx.expect(ctx.cli("score", run, "--no-ray"), 2, "generat")
    ctx.expect(ctx.cli("samples", run), 2, "no generations yet")

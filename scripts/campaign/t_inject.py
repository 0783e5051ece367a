"""Injection and races: control characters in paths and names never reach the terminal raw;
HTML and LaTeX in names and groups are escaped in the reports; a run name cannot write outside
the run directory; `status` and `samples` while a run writes and compacts its shards."""

from __future__ import annotations

import time

from campaign.core import PAIRS, Ctx, Result, TrialFailed, base_config, trial
from campaign.t_data import small

ESC = "\x1b]0;pwned\x07\x1b[2J"


def raw_controls(res: Result) -> None:
    """Nothing `res` printed holds an ESC, BEL or bidirectional override raw."""
    for ch in ("\x1b", "\x07", "\u202e"):
        if ch in res.text:
            raise TrialFailed(f"{ch!r} printed raw by `{' '.join(res.args)!r}`")


@trial("inject", "control characters in a missing config's path")
def esc_config_path(ctx: Ctx) -> None:
    res = ctx.cli("validate", f"c{ESC}.yaml")
    ctx.expect(res, 2, "\\u001b")
    raw_controls(res)


@trial("inject", "control characters in a model id, a method, a scorer and --out")
def esc_names(ctx: Ctx) -> None:
    for change in (
        {"models": [{"id": f"tiny-random/gpt2{ESC}"}]},
        {"methods": [f"vanilla{ESC}"]},
        {"scorers": [f"gender{ESC}"]},
        {"tasks": [f"sentiment{ESC}"]},
    ):
        res = ctx.cli("validate", ctx.config(small(**change)))
        ctx.expect(res, 2)
        raw_controls(res)
    res = ctx.cli("run", ctx.config(small()), "--out", f"r{ESC}", "--no-ray")
    ctx.expect(res, 2, "--out")
    raw_controls(res)


@trial("inject", "control characters in a prompt file's path")
def esc_data_path(ctx: Ctx) -> None:
    files = {"female": str(ctx.dir / f"f{ESC}.jsonl"), "male": str(PAIRS / "pairs-male.jsonl")}
    res = ctx.cli("validate", ctx.config(small(**{"dataset.files": files})))
    ctx.expect(res, 2, "dataset.files.female")
    raw_controls(res)


@trial("inject", "HTML and LaTeX in the run name, a model name and group names")
def html_latex(ctx: Ctx) -> None:
    evil = "<script>alert(1)</script> & 50%_$x#{}~^\\"
    files = {"f<b>&_%": str(PAIRS / "pairs-female.jsonl"), "m$#{}": str(PAIRS / "pairs-male.jsonl")}
    cfg = small(
        name=evil, models=[{"id": "tiny-random/gpt2", "name": evil}], **{"dataset.files": files}
    )
    ctx.expect(ctx.cli("run", ctx.config(cfg), "--out", "run", "--no-ray", "--no-progress"), 0)
    html = (ctx.dir / "run" / "report" / "index.html").read_text()
    if "<script>alert(1)" in html:
        raise TrialFailed("a model name reached report/index.html as HTML")
    tex = (ctx.dir / "run" / "report" / "report.tex").read_text()
    if "50%_$x" in tex:
        raise TrialFailed("a model name reached report.tex unescaped")
    res = ctx.cli("samples", "run", "--limit", "2")
    ctx.expect(res, 0)


@trial("inject", "a run name with ../ writes nothing outside --out")
def traversal(ctx: Ctx) -> None:
    (ctx.dir / "deep" / "er").mkdir(parents=True)
    before = {p for p in ctx.dir.rglob("*")}
    cfg = ctx.config(small(name="../../../escaped"), where=ctx.dir / "deep" / "er")
    tb = ctx.dir / "deep" / "er" / "tb"
    res = ctx.cli(
        "run",
        cfg,
        "--out",
        "run",
        "--no-ray",
        "--no-progress",
        "--tensorboard",
        tb,
        cwd=ctx.dir / "deep" / "er",
    )
    ctx.expect(res, 0)
    new = {p for p in ctx.dir.rglob("*")} - before
    outside = [p for p in new if not str(p).startswith(str(ctx.dir / "deep" / "er"))]
    if outside:
        raise TrialFailed(f"written outside the run's folder: {sorted(map(str, outside))[:3]}")


@trial("inject", "status, samples and aggregate while a run writes and compacts")
def readers_during_run(ctx: Ctx) -> None:
    cfg = ctx.config(base_config(**{"runtime.batch_size": 2, "dataset.limit": 3}))
    proc = ctx.popen("run", str(cfg), "--out", "run", "--no-ray", "--no-progress")
    polls = 0
    while proc.poll() is None and polls < 40:
        if (ctx.dir / "run" / "plan.parquet").exists():
            ctx.expect(ctx.cli("status", "run", timeout=120), 0)
            ctx.expect(ctx.cli("samples", "run", "--limit", "1", timeout=120), (0, 2))
            ctx.expect(
                ctx.cli("aggregate", "run", timeout=120), (0, 2)
            )  # 2: the run holds the lock
            polls += 1
        else:
            time.sleep(0.5)
    out, err = proc.communicate(timeout=600)
    ctx.results.append(Result(["run (read meanwhile)"], proc.returncode, out, err))
    ctx.expect(ctx.results[-1], 0)
    if polls == 0:
        raise TrialFailed("the run ended before any read")
    ctx.check_run(ctx.dir / "run", 24, ["gender", "sentiment-vader"])


@trial("inject", "score while a run holds the directory")
def score_during_run(ctx: Ctx) -> None:
    cfg = ctx.config(base_config(**{"runtime.batch_size": 2}))
    proc = ctx.popen("run", str(cfg), "--out", "run", "--no-ray", "--no-progress")
    while proc.poll() is None and not (ctx.dir / "run" / "plan.parquet").exists():
        time.sleep(0.2)
    res = ctx.cli("score", "run", "--no-ray")
    out, err = proc.communicate(timeout=600)
    ctx.results.append(Result(["run"], proc.returncode, out, err))
    ctx.expect(ctx.results[-1], 0)
    ctx.expect(res, (0, 2))
    if res.rc == 2 and "in use" not in res.text:
        raise TrialFailed(f"score refused without naming the holder: {res.show()}")
    ctx.check_run(ctx.dir / "run", 16, ["gender", "sentiment-vader"])

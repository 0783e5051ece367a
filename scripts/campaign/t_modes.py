"""Modes and the commands around a run: Ray vs in-process (the same texts), `aggregate`,
`samples`, `status`, `compare`, `power`, `validate --pilot`, `human sample` / `human import`,
tracking and export offline; good options run, bad ones are refused naming the option."""

from __future__ import annotations

import csv
from pathlib import Path

from campaign.core import RUN_CONFIGS, Ctx, TrialFailed, base_config, trial

RUN_CONFIGS["tokens5"] = lambda: base_config(**{"generation.max_new_tokens": 5})
RUN_CONFIGS["one-sample"] = lambda: base_config(samples_per_prompt=1, methods=["vanilla"])
SCORERS = ["gender", "sentiment-vader"]


@trial("modes", "Ray: the same texts as in-process", ray=True)
def ray_same(ctx: Ctx) -> None:
    texts = ctx.check_run(ctx.cached_run("base"))
    cfg = ctx.config(base_config())
    ctx.expect(ctx.cli("run", cfg, "--out", "run", "--no-progress"), 0)
    if ctx.check_run(ctx.dir / "run", 16, SCORERS) != texts:
        raise TrialFailed("Ray and in-process runs of one config made different texts")


@trial("modes", "Ray: batch 2, scoring during generation", ray=True)
def ray_follow(ctx: Ctx) -> None:
    cfg = ctx.config(
        base_config(**{"runtime.batch_size": 2, "runtime.score_during_generation": True})
    )
    ctx.expect(ctx.cli("run", cfg, "--out", "run", "--no-progress"), 0)
    ctx.check_run(ctx.dir / "run", 16, SCORERS)


def _options(
    cmd: str, good: list[list[str]], bad: list[tuple[list[str], str]], which: str = "base"
) -> None:
    @trial("modes", f"{cmd}: options good and bad")
    def check(ctx: Ctx) -> None:
        run = ctx.copy_run(which)
        for args in good:
            ctx.expect(ctx.cli(*cmd.split(), run, *args), 0)
        for args, needle in bad:
            ctx.expect(ctx.cli(*cmd.split(), run, *args), 2, needle)


_options(
    "aggregate",
    [["--n-boot", "0"], ["--seed", "7"], ["--ppl-max", "1e9"], ["--use-scorer", "sentiment-vader"]],
    [
        (["--ppl-max", "-1"], "--ppl-max"),
        (["--ppl-max", "nan"], "--ppl-max"),
        (["--n-boot", "-5"], "--n-boot"),
        (["--use-scorer", "bogus"], "bogus"),
    ],  # fmt: skip
)
_options(
    "samples",
    [
        ["--group", "x:female"],
        ["--where", "sentiment>0.5", "--sort=-sentiment"],
        ["--format", "csv", "--limit", "0"],
        ["--format", "jsonl"],
        ["--pair", "00000"],
        ["--status", "error"],
        ["--grep", "the"],
        ["--method", "vanilla", "--method", "lidao-min"],
    ],  # fmt: skip
    [
        (["--where", "bogus>1"], "bogus"),
        (["--where", "sentiment>abc"], "abc"),
        (["--where", "sentiment"], "sentiment"),
        (["--sort", "bogus"], "bogus"),
        (["--method", "bogus"], "bogus"),
        (["--limit", "-1"], "--limit"),
        (["--group", "q:female"], "q:female"),
        (["--task", "regard"], "regard"),
    ],  # fmt: skip
)
_options(
    "power",
    [
        ["--gap", "20", "--reps", "20", "--n-perm", "40"],  # the bounds' least (docs/cli.md)
        ["--gap", "20", "--reps", "20", "--n-perm", "40", "--samples", "1", "--samples", "4"],
    ],
    [
        (["--gap", "0"], "--gap"),
        (["--gap", "-5"], "--gap"),
        (["--gap", "nan"], "--gap"),
        (["--gap", "5", "--power", "1.5"], "--power"),
        (["--gap", "5", "--method", "bogus"], "bogus"),
        (["--gap", "5", "--samples", "0"], "--samples"),
        (["--gap", "5", "--reps", "0"], "--reps"),
        (["--gap", "5", "--reps", "19"], "--reps"),
        (["--gap", "5", "--n-perm", "39"], "--n-perm"),
        (["--gap", "5", "--metric", "bogus"], "bogus"),
    ],  # fmt: skip
)


@trial("modes", "power: a pilot of one sample per prompt cannot plan")
def power_one(ctx: Ctx) -> None:
    run = ctx.copy_run("one-sample")
    ctx.expect(
        ctx.cli("power", run, "--gap", "20", "--reps", "20", "--n-perm", "40"), 0, "cannot plan"
    )


@trial("modes", "status and validate --pilot")
def status_pilot(ctx: Ctx) -> None:
    run = ctx.copy_run()
    ctx.expect(ctx.cli("status", run), 0, "planned 8, done 8", "summary.parquet")
    cfg = ctx.config(base_config(**{"dataset.limit": 4}))
    ctx.expect(ctx.cli("validate", cfg, "--pilot", run), 0, "0 problem(s)")
    ctx.expect(ctx.cli("validate", cfg, "--pilot", ctx.dir / "nowhere"), 2, "nowhere")


@trial("modes", "compare: same plan, another plan, bad options")
def compare(ctx: Ctx) -> None:
    a, b = ctx.cached_run("base"), ctx.cached_run("tokens5")
    ctx.expect(ctx.cli("compare", a, a), 0)
    ctx.expect(ctx.cli("compare", a, b), 2, "--allow-plan-mismatch")
    ctx.expect(ctx.cli("compare", a, b, "--allow-plan-mismatch"), (0, 1))
    ctx.expect(ctx.cli("compare", a, a, "--metric", "bogus"), 2, "bogus")
    ctx.expect(ctx.cli("compare", a, a, "--n-boot", "-1"), 2, "--n-boot")
    ctx.expect(ctx.cli("compare", a, b, "--allow-plan-mismatch", "--fail-above", "0"), 1)


def fill(items: Path, out: Path, annotator: str, choice: str = "a") -> Path:
    rows = list(csv.DictReader(items.open(newline="", encoding="utf-8-sig")))
    with out.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({**r, "annotator": annotator, "fluency": choice, "friendliness": "tie"})
    return out


@trial("modes", "human: sample, answer, import, replace, aggregate")
def human(ctx: Ctx) -> None:
    run = ctx.copy_run()
    sample = ["--method", "lidao-min", "--vs", "vanilla", "--fraction", "0.5"]
    ctx.expect(ctx.cli("human", "sample", run, *sample, "--out", "set"), 0)
    items = ctx.dir / "set" / "items.csv"
    ctx.expect(ctx.cli("human", "import", run, fill(items, ctx.dir / "ann1.csv", "ann1")), 0)
    ctx.expect(ctx.cli("human", "import", run, fill(items, ctx.dir / "ann1b.csv", "ann1", "b")), 0)
    ctx.expect(ctx.cli("aggregate", run), 0)


@trial("modes", "human: bad options and bad answer files")
def human_bad(ctx: Ctx) -> None:
    run = ctx.copy_run()
    base = ["--method", "lidao-min", "--vs", "vanilla"]
    for args, needle in (
        (["--method", "bogus", "--vs", "vanilla"], "bogus"),
        (["--method", "vanilla", "--vs", "vanilla"], "vanilla"),
        ([*base, "--fraction", "0"], "--fraction"),
        ([*base, "--fraction", "1.5"], "--fraction"),
        ([*base, "--criteria", ""], "--criteria"),
    ):
        ctx.expect(ctx.cli("human", "sample", run, *args, "--out", "s"), 2, needle)
    ctx.expect(ctx.cli("human", "sample", run, *base, "--fraction", "0.5", "--out", "set"), 0)
    items = ctx.dir / "set" / "items.csv"
    bad = fill(items, ctx.dir / "bad.csv", "ann", "maybe")
    ctx.expect(ctx.cli("human", "import", run, bad), 2, "bad.csv", "maybe")
    (ctx.dir / "empty.csv").write_text("")
    ctx.expect(ctx.cli("human", "import", run, ctx.dir / "empty.csv"), 2, "empty.csv")
    lines = items.read_text(encoding="utf-8-sig").splitlines()
    (ctx.dir / "foreign.csv").write_text(
        "\n".join([lines[0], lines[1].replace(lines[1].split(",")[0], "zz-unknown", 1)]) + "\n"
    )
    ctx.expect(
        ctx.cli(
            "human", "import", run, fill(ctx.dir / "foreign.csv", ctx.dir / "foreign2.csv", "x")
        ),
        2,
        "foreign2.csv",
    )
    ctx.expect(ctx.cli("human", "import", run, ctx.dir / "nothing.csv"), 2, "nothing.csv")
    ctx.expect(ctx.cli("human", "import", run, ctx.dir / "set"), 2, "set")


@trial("modes", "list, --version, export and tracking offline")
def misc(ctx: Ctx) -> None:
    for what in ("methods", "scorers", "models"):
        ctx.expect(ctx.cli("list", what), 0)
    ctx.expect(ctx.cli("--version"), 0, "lidao-harness")
    run = ctx.copy_run()
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_campaignfaketoken"}
    res = ctx.cli("export", run, "--hub", "someone/results", **offline)
    ctx.expect(res, (1, 2), absent="hf_campaignfaketoken")
    ctx.expect(ctx.cli("aggregate", run, "--tensorboard", ctx.dir / "tb"), 0)
    ctx.expect(
        ctx.cli("aggregate", run, "--wandb", "proj", WANDB_MODE="online"), 1, "wandb", "aggregate"
    )


@trial("modes", "token-prior and train-head: good and bad inputs")
def tools(ctx: Ctx) -> None:
    (ctx.dir / "corpus.txt").write_text("She said hello.\nHe walked home.\n" * 5)
    tp = ["token-prior", "--model", "tiny-random/gpt2"]
    ctx.expect(ctx.cli(*tp, "--out", "prior.json", "corpus.txt"), 0)
    ctx.expect(ctx.cli(*tp, "--out", "p2.json", "nowhere.txt"), 2, "nowhere.txt")
    (ctx.dir / "adir").mkdir()
    ctx.expect(ctx.cli(*tp, "--out", "p3.json", "adir"), 2, "adir")
    cfg = ctx.config(
        base_config(methods=[{"name": "uddia", "params": {"prior": str(ctx.dir / "prior.json")}}])
    )
    ctx.expect(ctx.cli("validate", cfg), 0, "0 problem(s)")
    rows = "".join(
        f'{{"text": "text number {i} is {w}", "label": {i % 2}}}\n'
        for i, w in enumerate(["good", "bad"] * 8)
    )
    (ctx.dir / "train.jsonl").write_text(rows)
    th = ["train-head", "--model", "tiny-random/gpt2", "--task", "sentiment", "--epochs", "1"]
    good = ["--data", "train.jsonl", "--device", "cpu"]
    # labels 0/1 name no desirable class: the command asks for it rather than guessing
    ctx.expect(ctx.cli(*th, *good, "--out", "h0.pt"), 2, "pass --target-class")
    ctx.expect(ctx.cli(*th, *good, "--out", "head.pt", "--target-class", "1"), 0)
    ctx.expect(
        ctx.cli(*th, "--data", "missing.jsonl", "--out", "h2.pt", "--device", "cpu"),
        2,
        "missing.jsonl",
    )
    ctx.expect(
        ctx.cli(*th, "--data", "train.jsonl", "--out", "h3.pt", "--label-column", "nope"), 2, "nope"
    )
    ctx.expect(
        ctx.cli(*th, "--data", "train.jsonl", "--out", "h4.pt", "--epochs", "0"), 2, "--epochs"
    )

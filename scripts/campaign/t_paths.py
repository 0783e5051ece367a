"""Odd paths: spaces, unicode, relative paths from other folders, symlinks, `~`, a directory or
a named pipe where a file is expected, control characters and over-long names in `--out`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from campaign.core import PAIRS, Ctx, TrialFailed, trial
from campaign.t_data import small


def relative_config(folder: Path) -> Path:
    """`folder/c.yaml` whose prompt files are `data/…` relative to it."""
    (folder / "data").mkdir(parents=True)
    for g in ("female", "male"):
        shutil.copy(PAIRS / f"pairs-{g}.jsonl", folder / "data" / f"{g}.jsonl")
    files = {g: f"data/{g}.jsonl" for g in ("female", "male")}
    path = folder / "c.yaml"
    path.write_text(json.dumps(small(**{"dataset.files": files})))
    return path


def done(ctx: Ctx, run: Path, jobs: int = 4) -> None:
    ctx.check_run(run, jobs, ["gender", "sentiment-vader"])


@trial("paths", "spaces and unicode in the config's folder and --out")
def spaces_unicode(ctx: Ctx) -> None:
    cfg = relative_config(ctx.dir / "my configs ✓" / "évals 2024")
    out = ctx.dir / "runs dir" / "résultats ünï 结果"
    ctx.expect(ctx.cli("validate", cfg), 0, "0 problem(s)")
    ctx.expect(ctx.cli("run", cfg, "--out", out, "--no-ray", "--no-progress"), 0)
    done(ctx, out)
    ctx.expect(ctx.cli("status", str(out) + "/"), 0, "planned 4, done 4")


@trial("paths", "relative config and --out from another folder")
def relative_elsewhere(ctx: Ctx) -> None:
    relative_config(ctx.dir / "proj")
    (ctx.dir / "work").mkdir()
    res = ctx.cli(
        "run",
        "../proj/c.yaml",
        "--out",
        "out/r1",
        "--no-ray",
        "--no-progress",
        cwd=ctx.dir / "work",
    )
    ctx.expect(res, 0)
    done(ctx, ctx.dir / "work" / "out" / "r1")
    ctx.expect(ctx.cli("samples", "work/out/r1", "--limit", "1"), 0)


@trial("paths", "a symlinked config in another folder")
def symlinked_config(ctx: Ctx) -> None:
    real = relative_config(ctx.dir / "real")
    (ctx.dir / "links").mkdir()
    (ctx.dir / "links" / "c.yaml").symlink_to(real)
    res = ctx.cli("validate", ctx.dir / "links" / "c.yaml")
    if res.rc != 0:  # resolved against the link's folder: the message must say where it looked
        ctx.expect(res, 2, str(ctx.dir / "links" / "data"))


@trial("paths", "~ in a prompt path")
def tilde(ctx: Ctx) -> None:
    home = Path(ctx.env["HOME"])
    (home / "prompts").mkdir(exist_ok=True)
    for g in ("female", "male"):
        shutil.copy(PAIRS / f"pairs-{g}.jsonl", home / "prompts" / f"{g}.jsonl")
    files = {g: f"~/prompts/{g}.jsonl" for g in ("female", "male")}
    cfg = ctx.config(small(**{"dataset.files": files}))
    ctx.expect(ctx.cli("run", cfg, "--out", "run", "--no-ray", "--no-progress"), 0)
    done(ctx, ctx.dir / "run")


@trial("paths", "--out a symlink to a folder, and with ..")
def out_symlink(ctx: Ctx) -> None:
    (ctx.dir / "target").mkdir()
    (ctx.dir / "link").symlink_to(ctx.dir / "target", target_is_directory=True)
    (ctx.dir / "sub").mkdir()
    cfg = ctx.config(small())
    ctx.expect(ctx.cli("run", cfg, "--out", "link/run", "--no-ray", "--no-progress"), 0)
    done(ctx, ctx.dir / "target" / "run")
    res = ctx.cli("status", "../link/run", cwd=ctx.dir / "sub")
    ctx.expect(res, 0, "planned 4, done 4")


def _config_path(name: str, make: object, *needles: str) -> None:
    @trial("paths", f"refused: config {name}")
    def check(ctx: Ctx) -> None:
        path = ctx.dir / "c.yaml"
        if make == "dir":
            path.mkdir()
        elif make == "fifo":
            os.mkfifo(path)
        ctx.expect(ctx.cli("validate", path, timeout=60), 2, "c.yaml", *needles)
        ctx.expect(ctx.cli("run", path, "--out", "run", timeout=60), 2, "c.yaml", *needles)


_config_path("missing", None)
_config_path("a directory", "dir", "directory")
_config_path("a named pipe", "fifo", "not a regular file")


def _bad_out(name: str, out: str, *needles: str, make: str = "") -> None:
    @trial("paths", f"refused: --out {name}")
    def check(ctx: Ctx) -> None:
        cfg = ctx.config(small())
        if make:
            (ctx.dir / make).write_text("a file\n")
        ctx.expect(ctx.cli("validate", cfg, "--out", out), (1, 2), *needles)
        res = ctx.cli("run", cfg, "--out", out, "--no-ray", "--no-progress")
        ctx.expect(res, (1, 2), *needles)
        if "\n" in res.err.strip() and "problem" not in res.err:
            raise TrialFailed(f"more than one line for a refused --out: {res.show()}")


_bad_out("with a newline", "runs/a\nb", "--out")
_bad_out("with a tab", "runs/a\tb", "--out")
_bad_out("an existing file", "afile", "afile", make="afile")
_bad_out("under a file", "afile/run", "afile", make="afile")
_bad_out("a name over 255 bytes", "r" * 300, "File name too long")


@trial("paths", "--out a folder of other files is refused, its files kept")
def foreign_out(ctx: Ctx) -> None:
    (ctx.dir / "mine").mkdir()
    (ctx.dir / "mine" / "thesis.tex").write_text("precious\n")
    cfg = ctx.config(small())
    res = ctx.cli("run", cfg, "--out", "mine", "--no-ray", "--no-progress")
    if (ctx.dir / "mine" / "thesis.tex").read_text() != "precious\n":
        raise TrialFailed("a foreign file in --out was changed")
    if res.rc == 0:
        done(ctx, ctx.dir / "mine")
    else:
        ctx.expect(res, 2, "mine")

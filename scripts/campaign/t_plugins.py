"""Plugins: the example package installed with pip (entry points), and `--include` modules that
are missing, broken at import, name a class that does not exist, fail in every job, or return
scores that are not numbers; one plugin on a local Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from textwrap import dedent

from campaign.core import REPO, Ctx, TrialFailed, base_config, trial
from campaign.t_data import small


def site(ctx: Ctx) -> str:
    """The example plugin, installed with pip into a folder of its own (once a campaign)."""
    if "site" not in ctx.shared:
        import shutil

        src, target = ctx.root / "plugin-src", ctx.root / "plugin-site"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(REPO / "examples" / "plugin", src)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        res = subprocess.run(
            [*pip, "--no-index", "--target", str(target), str(src)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if res.returncode:
            raise TrialFailed(f"pip install of the example plugin failed: {res.stderr[-800:]}")
        ctx.shared["site"] = str(target)
    return str(ctx.shared["site"])


@trial("plugins", "the installed example: listed, validated, run")
def example(ctx: Ctx) -> None:
    env = {"PYTHONPATH": site(ctx)}
    ctx.expect(ctx.cli("list", "methods", **env), 0, "boost-word", "strength: float = 2.0")
    ctx.expect(ctx.cli("list", "scorers", **env), 0, "sentiment-wordlist")
    cfg = ctx.config(
        small(
            methods=["vanilla", {"name": "boost-word", "params": {"strength": 50.0}}],
            scorers=["gender", "sentiment-wordlist"],
        )
    )
    ctx.expect(ctx.cli("validate", cfg, **env), 0, "0 problem(s)")
    ctx.expect(ctx.cli("run", cfg, "--out", "run", "--no-ray", "--no-progress", **env), 0)
    ctx.check_run(ctx.dir / "run", 8, ["gender", "sentiment-wordlist"])
    ctx.expect(ctx.cli("status", "run", **env), 0, "boost-word")


@trial("plugins", "the example's parameters checked by their kinds")
def example_params(ctx: Ctx) -> None:
    env = {"PYTHONPATH": site(ctx)}
    for params, needle in (
        ({"strength": "x"}, "strength"),
        ({"strenght": 1.0}, "strength"),
        ({"word": 3}, "word"),
    ):
        cfg = ctx.config(small(methods=[{"name": "boost-word", "params": params}]))
        ctx.expect(ctx.cli("validate", cfg, **env), 2, "methods.0", needle)


@trial("plugins", "the example's method without the package installed")
def example_missing(ctx: Ctx) -> None:
    cfg = ctx.config(small(methods=["boost-word"]))
    ctx.expect(ctx.cli("validate", cfg), 2, "boost-word")


BROKEN_IMPORT = "raise RuntimeError('boom while importing')\n"
SYNTAX = "def broken(:\n"
GHOST = """
from workers.methods.registry import register_method
register_method("ghost", "nowhere_pkg.mod:Ghost")
"""
METHODS = """
from workers.methods.base import Vanilla
from workers.methods.registry import register_method
from workers.scorers.base import Scorer
from workers.scorers.registry import register_scorer


class BadInit(Vanilla):
    name = "bad-init"

    def __init__(self, *args, **kwargs):
        raise ValueError("bad-init cannot start")


class BadStep(Vanilla):
    name = "bad-step"

    def next_logprobs(self, ctx):
        raise RuntimeError("bad-step fails every step")


class NanScorer(Scorer):
    name = "nan-sentiment"
    metric = "sentiment"

    @property
    def version(self):
        return "nan-1"

    def score(self, rows):
        return [{**self.key(r), "sentiment": float("nan")} for r in rows]


class RaiseScorer(NanScorer):
    name = "raise-sentiment"

    def score(self, rows):
        raise RuntimeError("raise-sentiment always fails")


register_method("bad-init", "plug_methods:BadInit")
register_method("bad-step", "plug_methods:BadStep")
register_method("param-method", "plug_methods:BadStep", params={"level": 1})
register_scorer("nan-sentiment", "plug_methods:NanScorer", "sentiment")
register_scorer("raise-sentiment", "plug_methods:RaiseScorer", "sentiment")
"""
CLASH = """
from workers.methods.registry import register_method
register_method("vanilla", "plug_clash:Other")
"""
BAD_METRIC = """
from workers.scorers.registry import register_scorer
register_scorer("odd", "plug_metric:Odd", "happiness")
"""


def module(ctx: Ctx, name: str, text: str) -> None:
    (ctx.dir / f"{name}.py").write_text(dedent(text))


def _bad_include(name: str, mod: str, text: str, rc: int, *needles: str) -> None:
    @trial("plugins", f"--include {name}")
    def check(ctx: Ctx) -> None:
        if text:
            module(ctx, mod, text)
        cfg = ctx.config(small())
        for args in (["list", "methods"], ["validate", str(cfg)]):
            ctx.expect(ctx.cli("--include", mod, *args), rc, *needles)


_bad_include("a module that is not there", "no_such_mod", "", 2, "no_such_mod")
_bad_include(
    "a module that raises on import",
    "plug_boom",
    BROKEN_IMPORT,
    2,
    "plug_boom",
    "boom while importing",
)
_bad_include("a module with a syntax error", "plug_syntax", SYNTAX, 2, "plug_syntax")
_bad_include("registering a built-in's name", "plug_clash", CLASH, 2, "vanilla")
_bad_include("registering an unknown metric", "plug_metric", BAD_METRIC, 2, "happiness")


@trial("plugins", "--include a method whose class is not installed")
def ghost(ctx: Ctx) -> None:
    module(ctx, "plug_ghost", GHOST)
    cfg = ctx.config(small(methods=["vanilla", "ghost"]))
    ctx.expect(ctx.cli("--include", "plug_ghost", "validate", cfg), 2, "nowhere_pkg")
    ctx.expect(
        ctx.cli("--include", "plug_ghost", "run", cfg, "--out", "run", "--no-ray"), 2, "nowhere_pkg"
    )


def _failing(name: str, methods: list[str], scorers: list[str], *needles: str) -> None:
    @trial("plugins", f"--include {name}: run exits non-zero naming it")
    def check(ctx: Ctx) -> None:
        module(ctx, "plug_methods", METHODS)
        cfg = ctx.config(small(methods=methods, scorers=scorers))
        ctx.expect(ctx.cli("--include", "plug_methods", "validate", cfg), 0)
        res = ctx.cli(
            "--include", "plug_methods", "run", cfg, "--out", "run", "--no-ray", "--no-progress"
        )
        ctx.expect(res, 1, *needles)
        if (ctx.dir / "run" / "plan.parquet").exists():
            ctx.expect(ctx.cli("--include", "plug_methods", "status", "run"), 0)


_failing("a method that cannot start", ["vanilla", "bad-init"], ["gender"], "bad-init")
_failing("a method failing every job", ["vanilla", "bad-step"], ["gender"], "bad-step", "samples")
_failing(
    "a scorer failing every chunk", ["vanilla"], ["gender", "raise-sentiment"], "raise-sentiment"
)
_failing("a scorer of NaN scores", ["vanilla"], ["gender", "nan-sentiment"], "nan-sentiment")


@trial("plugins", "--include a method with a declared parameter: kinds checked")
def declared(ctx: Ctx) -> None:
    module(ctx, "plug_methods", METHODS)
    cfg = ctx.config(small(methods=[{"name": "param-method", "params": {"level": "high"}}]))
    ctx.expect(ctx.cli("--include", "plug_methods", "validate", cfg), 2, "methods.0", "level")


@trial("plugins", "the example plugin on a local Ray, with --include from the folder", ray=True)
def on_ray(ctx: Ctx) -> None:
    env = {"PYTHONPATH": site(ctx)}
    module(ctx, "plug_methods", METHODS)
    cfg = ctx.config(
        base_config(
            methods=["vanilla", "boost-word"],
            scorers=["gender", "sentiment-wordlist"],
            samples_per_prompt=1,
        )
    )
    res = ctx.cli("--include", "plug_methods", "run", cfg, "--out", "run", "--no-progress", **env)
    ctx.expect(res, 0)
    ctx.check_run(ctx.dir / "run", 8, ["gender", "sentiment-wordlist"])
    _ = Path

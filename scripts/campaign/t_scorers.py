"""Scorer faults: the fake Perspective endpoint (tests/fake_perspective.py, real HTTP on
127.0.0.1) answers 429, 503, times out, sends garbage or drops the connection. Each faulty
`score` ends with exit 3 and one line naming what failed; the plain `score` after, with the
endpoint healthy, scores every row. A 400 for one text stays final; a bad key stops the run; the
key is never printed nor stored."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from campaign.core import REPO, SECRET, Ctx, TrialFailed, base_config, rows_of, trial

sys.path.insert(0, str(REPO / "tests"))
from fake_perspective import FakePerspective  # noqa: E402

FAST = {"qps": 50, "quota_window_s": 1, "max_retries": 1, "backoff_initial_s": 0.02}
FAST |= {"backoff_max_s": 0.05, "timeout_s": 0.5, "progress": False}
KEY = {"PERSPECTIVE_API_KEY": SECRET}


def sets(fake: FakePerspective, **more: Any) -> list[str]:
    params = {"endpoint": fake.endpoint, **FAST, **more}
    return [x for k, v in params.items() for x in ("--set", f"{k}={v}")]


def toxicity(run: Path) -> tuple[int, int]:
    """(ok, error) Perspective rows of `run`, one per job id."""
    rows, ok = rows_of(run / "scores" / "perspective", ("job_id", "status", "scorer_version"))
    errors = {r["job_id"] for r in rows if r["status"] == "error"} - {r["job_id"] for r in ok}
    return len({r["job_id"] for r in ok}), len(errors)


def fault(name: str, inject: Callable[[FakePerspective], None], needle: str) -> None:
    @trial("scorers", f"transient: {name}, then a plain score recovers")
    def check(ctx: Ctx) -> None:
        run = ctx.copy_run()
        with FakePerspective(api_key=SECRET) as fake:
            with fake.lock:
                inject(fake)
            res = ctx.cli("score", run, "--scorer", "perspective", "--no-ray", *sets(fake), **KEY)
            ctx.expect(res, 3, "transient reason", needle, f"score {run}")
            if toxicity(run)[1]:
                raise TrialFailed("a transient failure was stored as an error row")
            with fake.lock:
                fake.burst_429, fake.scripts, fake.delay_s = 0, {}, 0.0
                fake.drop_batches = fake.garbage_batches = 0
                fake.batch_status.clear()
            ctx.expect(ctx.cli("score", run, "--no-ray", **KEY), 0)
        if toxicity(run) != (16, 0):
            raise TrialFailed(
                f"after the plain score: (ok, error) = {toxicity(run)}, wanted (16, 0)"
            )
        ctx.check_secret(run)


def _every_text(status: int) -> Callable[[FakePerspective], None]:
    def inject(fake: FakePerspective) -> None:
        fake.batch_status = [status] * 1000

    return inject


def _burst(fake: FakePerspective) -> None:
    fake.burst_429 = 10**6


def _slow(fake: FakePerspective) -> None:
    fake.delay_s = 1.5


def _drop(fake: FakePerspective) -> None:
    fake.drop_batches = 1000


def _garbage(fake: FakePerspective) -> None:
    fake.garbage_batches = 1000


fault("429 on every call", _burst, "rate limited")
fault("503 on every batch", _every_text(503), "server error")
fault("500 on every batch", _every_text(500), "server error")
fault("answers slower than timeout_s", _slow, "timed out")
fault("connections dropped", _drop, "perspective")
fault("garbage answers", _garbage, "unparsable")


@trial("scorers", "a few 429s: recovered within the scorer's own retries, exit 0")
def few_429(ctx: Ctx) -> None:
    run = ctx.copy_run()
    with FakePerspective(api_key=SECRET) as fake:
        fake.burst_429 = 6
        res = ctx.cli("score", run, "--scorer", "perspective", "--no-ray", *sets(fake), **KEY)
        ctx.expect(res, 0, "6 retries")
    if toxicity(run) != (16, 0):
        raise TrialFailed(f"(ok, error) = {toxicity(run)}")


@trial("scorers", "a 400 for one text stays final and counted")
def final_400(ctx: Ctx) -> None:
    run = ctx.copy_run()
    text = sorted(t for t in ctx.check_run(run).values())[0]
    with FakePerspective(api_key=SECRET) as fake:
        fake.final_400 = {text}
        res = ctx.cli("score", run, "--scorer", "perspective", "--no-ray", *sets(fake), **KEY)
        ctx.expect(res, 0)
        ok, err = toxicity(run)
        ctx.expect(ctx.cli("score", run, "--no-ray", **KEY), 0)
        if toxicity(run) != (ok, err) or err < 1 or ok + err != 16:
            raise TrialFailed(f"(ok, error) {(ok, err)} then {toxicity(run)}")
        calls = len(fake.calls)
        ctx.expect(ctx.cli("score", run, "--no-ray", **KEY), 0)
        if len(fake.calls) != calls:
            raise TrialFailed("a final 400 was asked again")
        ctx.expect(ctx.cli("status", run), 0, "error")


@trial("scorers", "a bad key stops scoring, writes nothing, says so")
def bad_key(ctx: Ctx) -> None:
    run = ctx.copy_run()
    with FakePerspective(api_key="another-key") as fake:
        res = ctx.cli("score", run, "--scorer", "perspective", "--no-ray", *sets(fake), **KEY)
        ctx.expect(res, 1, "key")
    if toxicity(run) != (0, 0):
        raise TrialFailed(f"rows written with a bad key: {toxicity(run)}")
    ctx.check_secret(run)


@trial("scorers", "an endpoint nothing listens on: validate names it; score exits 3")
def closed_endpoint(ctx: Ctx) -> None:
    run = ctx.copy_run()
    params = {"endpoint": "http://127.0.0.1:9/", **FAST}
    cfg = ctx.config(base_config(scorers=["gender", {"name": "perspective", "params": params}]))
    ctx.expect(ctx.cli("validate", cfg, **KEY), 2, "endpoint")
    sets_ = [x for k, v in params.items() for x in ("--set", f"{k}={v}")]
    ctx.expect(
        ctx.cli("score", run, "--scorer", "perspective", "--no-ray", *sets_, **KEY), 3, "transient"
    )


@trial("scorers", "run with Perspective rate-limited: exit 3, then a plain score")
def run_limited(ctx: Ctx) -> None:
    with FakePerspective(api_key=SECRET) as fake:
        params = {"endpoint": fake.endpoint, **FAST}
        cfg = base_config(
            scorers=["gender", {"name": "perspective", "params": params}], methods=["vanilla"]
        )
        path = ctx.config(cfg)
        fake.burst_429 = 10**6
        res = ctx.cli("run", path, "--out", "run", "--no-ray", "--no-progress", **KEY)
        ctx.expect(res, 3, "rate limited")
        with fake.lock:
            fake.burst_429 = 0
        ctx.expect(ctx.cli("score", "run", "--no-ray", **KEY), 0)
    ctx.check_run(ctx.dir / "run", 8, ["gender", "perspective"])
    ctx.check_secret(ctx.dir / "run")


@trial("scorers", "score during generation with Perspective failing, on Ray", ray=True)
def follow_on_ray(ctx: Ctx) -> None:
    with FakePerspective(api_key=SECRET) as fake:
        params = {"endpoint": fake.endpoint, **FAST}
        cfg = base_config(
            scorers=["gender", {"name": "perspective", "params": params}],
            methods=["vanilla"],
            **{"runtime.score_during_generation": True},
        )
        fake.batch_status = [503] * 1000
        res = ctx.cli("run", ctx.config(cfg), "--out", "run", "--no-progress", **KEY)
        ctx.expect(res, 3, "server error")
        with fake.lock:
            fake.batch_status.clear()
        ctx.expect(ctx.cli("score", "run", **KEY), 0)
    ctx.check_run(ctx.dir / "run", 8, ["gender", "perspective"])


@trial("scorers", "--cache-only with an empty cache: missing, not errors")
def cache_only(ctx: Ctx) -> None:
    run = ctx.copy_run()
    ctx.expect(
        ctx.cli("score", run, "--scorer", "perspective", "--cache-only", "--no-ray"), 0, "missing"
    )
    if toxicity(run) != (0, 0):
        raise TrialFailed(f"cache-only wrote rows: {toxicity(run)}")


@trial("scorers", "the key from api_key_file, never stored")
def key_file(ctx: Ctx) -> None:
    run = ctx.copy_run()
    (ctx.dir / "key.txt").write_text(SECRET + "\n")
    with FakePerspective(api_key=SECRET) as fake:
        args = sets(fake, api_key_file=str(ctx.dir / "key.txt"))
        ctx.expect(ctx.cli("score", run, "--scorer", "perspective", "--no-ray", *args), 0)
    if toxicity(run) != (16, 0):
        raise TrialFailed(f"(ok, error) = {toxicity(run)}")
    ctx.check_secret(run)


@trial("scorers", "scorer parameters refused by score --set")
def score_set(ctx: Ctx) -> None:
    run = ctx.copy_run()
    bad = [
        (["--scorer", "sentiment-vader", "--set", "text_field=bogus"], "text_field"),
        (["--scorer", "sentiment-vader", "--set", "bogus=1"], "bogus"),
        (["--scorer", "vadr"], "vadr"),
        (["--scorer", "perplexity", "--set", "batch_size=0"], "batch_size"),
        (["--scorer", "perplexity", "--set", "model=./nowhere"], "model"),
        (["--set", "text_field=x"], "sentiment-vader.text_field=x"),
        (
            ["--scorer", "gender", "--scorer", "sentiment-vader", "--set", "text_field=prompt"],
            "sentiment-vader.text_field",
        ),
    ]
    for args, needle in bad:
        ctx.expect(ctx.cli("score", run, "--no-ray", *args), 2, needle)


@trial("scorers", "re-scoring an old run with perplexity and --overwrite")
def rescore(ctx: Ctx) -> None:
    run = ctx.copy_run()
    res = ctx.cli(
        "score", run, "--no-ray", "--scorer", "perplexity", "--set", "model=tiny-random/gpt2"
    )
    ctx.expect(res, 0)
    ctx.expect(ctx.cli("score", run, "--no-ray", "--scorer", "gender", "--overwrite"), 0)
    ctx.check_run(run, 16, ["gender", "sentiment-vader", "perplexity"])
    ctx.expect(ctx.cli("aggregate", run, "--ppl-max", "1e9"), 0)

"""Time estimates beside the plan's counts (docs/cli.md, validate): `validate` prints them,
`run` logs them first. Perspective: texts × window / ⌊qps × window⌋ (an upper bound: repeated
and cached texts are not asked again; none with `cache_only`, which sends nothing); generation: tokens per method over its speed, shared by
the model's replicas. Over a day: a warning.

The only generation speeds measured in this project are `benchmarks/bench_methods.py`'s on its
development machine; a model's speed is scaled from them by its parameter count (FLOPs per
token), so a GPU replica is many times faster. Models whose size is not listed get no estimate.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from harness.config import RunConfig
from jobs.catalog import SCORER_PARAMS, resolve_params

log = logging.getLogger("harness")
DAY_S = 86_400.0
PREFIX = "estimate "  # every estimate line starts with it (after the indent)
# Generated tokens per second of one replica, per tuning scope and method: GPT-2 small shape
# (124M parameters), batch 8, 20 tokens, `--threads 1` on the 2-core CPU (docs/performance.md,
# the all-methods sweeps of 23 Nov 2026: `--scope context` 18:00–18:21, `--scope last`
# 16:23–16:41 UTC).
MEASURED_TOKENS_PER_S: dict[str, dict[str, float]] = {
    "context": {
        "vanilla": 35.3,
        "uddia": 7.5,
        "lidao-min": 7.1,
        "lidao-prod": 6.7,
        "elidao-min": 6.0,
        "elidao-prod": 6.1,
    },
    "last": {
        "vanilla": 30.6,
        "uddia": 7.8,
        "lidao-min": 8.1,
        "lidao-prod": 8.8,
        "elidao-min": 7.0,
        "elidao-prod": 7.6,
    },
}
MEASURED_PARAMS_M = 124.0  # the benchmark's model
SOURCE = (
    "benchmarks/bench_methods.py on a 2-core CPU, GPT-2 small shape, batch 8 "
    "(docs/performance.md), scaled by parameter count"
)
# Parameters (millions) of models whose speed is estimated by scaling the measured one.
MODEL_PARAMS_M: dict[str, float] = {
    "gpt2": 124.0,
    "gpt2-medium": 355.0,
    "gpt2-large": 774.0,
    "gpt2-xl": 1558.0,
    "facebook/opt-6.7b": 6700.0,
    "tiiuae/falcon-7b-instruct": 6920.0,
}


@dataclass(frozen=True)
class Estimate:
    """One stage's estimated time (None: cannot be estimated) and how it was computed."""

    what: str
    seconds: float | None
    detail: str

    def line(self) -> str:
        took = "none" if self.seconds is None else duration(self.seconds)
        warn = " — WARNING: over a day" if self.seconds is not None and self.seconds > DAY_S else ""
        return f"  {PREFIX}{self.what}: {took} ({self.detail}){warn}"


def duration(seconds: float) -> str:
    """`45 s`, `14 min`, `3.2 h`, `28.9 days`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} days"


def perspective_estimate(cfg: RunConfig, texts: int) -> Estimate | None:
    """The Perspective stage for `texts` generations (None: no Perspective scorer)."""
    entry = next((s for s in cfg.scorers if s.name == "perspective"), None)
    if entry is None:
        return None
    params = {**SCORER_PARAMS["perspective"], **entry.params}
    if params["cache_only"]:
        return Estimate("perspective", 0.0, "cache_only: texts are looked up, none is sent")
    qps, window = float(params["qps"]), float(params["quota_window_s"])
    per_window = math.floor(qps * window + 1e-9)  # what the rate limiter lets through
    if per_window < 1:
        return Estimate("perspective", None, f"qps {qps:g} over {window:g} s allows no call")
    return Estimate(
        "perspective",
        texts * window / per_window,
        f"up to {texts:,} texts at {per_window} per {window:g} s window (qps {qps:g}); "
        "repeated and cached texts are not asked again",
    )


def generation_estimates(cfg: RunConfig, jobs_per_slice: int) -> list[Estimate]:
    """One estimate per model for `jobs_per_slice` jobs of each method × task."""
    from harness.stages.generation.planning import generation_for
    from harness.stages.generation.reservation import request_budget

    budget = request_budget(cfg)
    out = []
    for model in cfg.models:
        replicas = budget.replicas.get(model.ref().id) or model.replicas or 1
        tokens = jobs_per_slice * generation_for(cfg, model).max_new_tokens * len(cfg.tasks)
        size = MODEL_PARAMS_M.get(model.id.removeprefix("openai-community/"))
        seconds, rates, missing = 0.0, [], []
        for method in cfg.methods:
            scope = resolve_params(method.name, dict(method.params), model.id).get("scope")
            rate = MEASURED_TOKENS_PER_S.get(str(scope or "context"), {}).get(method.name)
            if size is None or rate is None:
                missing.append(method.name)
                continue
            speed = rate * MEASURED_PARAMS_M / size
            seconds += tokens / speed
            rates.append(f"{method.name} {speed:.2g}")
        what = f"generation {model.label}"
        if not rates:
            known = ", ".join(MODEL_PARAMS_M)
            out.append(Estimate(what, None, f"no calibration for it (sized models: {known})"))
            continue
        left = f"; not counted, no calibration: {', '.join(missing)}" if missing else ""
        detail = (
            f"{tokens:,} tokens per method on {replicas} replica(s); tokens/s per replica: "
            f"{', '.join(rates)}; from {SOURCE}{left}"
        )
        out.append(Estimate(what, seconds / replicas, detail))
    return out


def estimate_lines(cfg: RunConfig, n_prompts: int) -> list[str]:
    """The estimate lines of a plan with `n_prompts` prompts."""
    per_slice = n_prompts * cfg.samples_per_prompt
    texts = per_slice * len(cfg.models) * len(cfg.methods) * len(cfg.tasks)
    found = [perspective_estimate(cfg, texts), *generation_estimates(cfg, per_slice)]
    return [e.line() for e in found if e is not None]


def log_estimates(lines: list[str]) -> None:
    """`run`'s start: the estimate lines of its `validate` report, a warning for those over a
    day."""
    for line in lines:
        if line.strip().startswith(PREFIX):
            (log.warning if "WARNING" in line else log.info)(line.strip())

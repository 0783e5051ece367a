"""Time estimates beside the plan's counts (docs/cli.md, validate): `validate` prints them,
`run` logs them first. Perspective: texts × window / ⌊qps × window⌋ (an upper bound: repeated
and cached texts are not asked again); generation: tokens per method over its calibrated speed
(`jobs.catalog.calibration`), shared by the model's replicas. Over a day: a warning.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from harness.config import RunConfig
from jobs.catalog import SCORER_PARAMS, resolve_params
from jobs.catalog.calibration import MODEL_PARAMS_M, estimated_speed

log = logging.getLogger("harness")
DAY_S = 86_400.0
PREFIX = "estimate "  # every estimate line starts with it (after the indent)


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
        seconds, rates, missing, source = 0.0, [], [], ""
        for method in cfg.methods:
            scope = resolve_params(method.name, dict(method.params), model.id).get("scope")
            speed = estimated_speed(model.id, method.name, str(scope or "context"))
            if speed is None:
                missing.append(method.name)
                continue
            seconds += tokens / speed.tokens_per_s
            rates.append(f"{method.name} {speed.tokens_per_s:.2g}")
            source = speed.source
        what = f"generation {model.label}"
        if not rates:
            known = ", ".join(MODEL_PARAMS_M)
            out.append(Estimate(what, None, f"no calibration for it (sized models: {known})"))
            continue
        left = f"; not counted, no calibration: {', '.join(missing)}" if missing else ""
        detail = (
            f"{tokens:,} tokens per method on {replicas} replica(s); tokens/s per replica: "
            f"{', '.join(rates)}; from {source}{left}"
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

"""Time estimates beside the plan's counts (docs/cli.md, validate): `validate` prints them,
`run` logs them first. Perspective: texts × window / ⌊qps × window⌋ (an upper bound: repeated
and cached texts are not asked again; none with `cache_only`, which sends nothing); generation: tokens per method over its speed, shared by
the model's replicas. Over a day: a warning.

Generation speeds are the project's measurements, scaled by the model's parameter count
(`harness.stages.generation.model_size`: its files, its config.json, its GGUF table, its name):
a GPU replica from the H100 figures (GPT-2 large shape), a CPU replica from the 2-core CPU's
(GPT-2 small shape, one thread). Methods without a measurement are counted at the slowest
measured method's speed, and named. CPU replicas are those `run` would choose
(`harness.stages.generation.cpu_sizing`), GPU replicas the budget's.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from harness.config import RunConfig
from harness.stages.generation.cpu_sizing import CpuChoice
from jobs.catalog import SCORER_PARAMS, resolve_params

log = logging.getLogger("harness")
DAY_S = 86_400.0
PREFIX = "estimate "  # every estimate line starts with it (after the indent)
# Generated tokens per second of one CPU replica, per tuning scope and method: GPT-2 small shape
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
MEASURED_PARAMS_M = 124.0  # the CPU benchmark's model
# One H100 (docs/performance.md, "On an H100", 27 Nov 2026), GPT-2 large shape, `context`
# scope: lidao-min end to end at the driver's GPU batches (the paper row: 69,937 tokens in
# 109.6 s); the others by their speed relative to lidao-min's in the methods table (vanilla at
# batch 128: 3,032.8 / 520.6; uddia and elidao-min at batch 32: 130.1 / 137.0, 112.8 / 137.0).
GPU_TOKENS_PER_S: dict[str, float] = {
    "lidao-min": 638.0,
    "vanilla": 638.0 * 3032.8 / 520.6,
    "uddia": 638.0 * 130.1 / 137.0,
    "elidao-min": 638.0 * 112.8 / 137.0,
}
GPU_PARAMS_M = 774.0  # GPT-2 large
CPU_SOURCE = "2-core CPU, GPT-2 small shape, batch 8, one thread (docs/performance.md)"
GPU_SOURCE = "one H100, GPT-2 large shape (docs/performance.md)"


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


@dataclass(frozen=True)
class Site:
    """Where a model entry generates, for its estimate: on GPUs or CPUs, how many replicas."""

    gpu: bool
    replicas: int
    note: str = ""  # e.g. GPUs asked of a machine that has none
    cpu: CpuChoice | None = None  # the CPU replicas `run` would choose on this machine


def generation_sites(
    cfg: RunConfig, jobs_per_slice: int | None, local: bool, use_ray: bool
) -> dict[int, Site]:
    """Each model entry's site: on a local Ray, the models on its CPUs sized as `run` sizes
    them; the models on GPUs with the GPU budget's replicas. A GPU budget (`runtime.gpus`)
    counts as GPUs asked for even where this machine has none (a config for a cluster)."""
    from harness.cli.machine import local_gpus
    from harness.stages.generation.cpu_sizing import cpu_choices, cpu_models
    from harness.stages.generation.reservation import budget_for, gpu_share
    from harness.stages.scoring.follow import followers

    rt = cfg.runtime
    here = local_gpus()[0] if local else 0
    on_gpu = [i for i, m in enumerate(cfg.models) if gpu_share(m, rt.device) > 0]
    asked = {i for i in on_gpu if rt.gpus is not None or cfg.models[i].num_gpus}
    if local and not here:
        on_gpu = sorted(asked)  # the others run on this machine's CPUs
    sized: dict[int, CpuChoice] = {}
    if local and use_ray:
        slices = len(cfg.methods) * len(cfg.tasks)
        per = [jobs_per_slice if jobs_per_slice is not None else 10**9] * slices
        cpu = [i for i in cpu_models(cfg, here) if i not in on_gpu]
        sized = cpu_choices(cfg, {i: per for i in cpu}, followers(cfg))
    gpus = float(rt.gpus) if rt.gpus is not None else (float(here) if local else None)
    budget = budget_for(cfg.models, rt.device, rt.gpus, gpus)
    note = "; this machine has none: a local run uses its CPUs" if local and not here else ""
    sites = {}
    for i, model in enumerate(cfg.models):
        if i in on_gpu:
            count = budget.replicas.get(model.ref().id) or model.replicas or 1
            sites[i] = Site(True, count, note)
        elif i in sized:
            sites[i] = Site(False, sized[i].replicas, cpu=sized[i])
        else:
            sites[i] = Site(False, model.replicas or 1)
    return sites


def cpu_only_here(cfg: RunConfig, local: bool, use_ray: bool) -> bool:
    """Whether every model generates on this machine's CPUs (a local Ray, no GPU asked)."""
    return all(s.cpu is not None for s in generation_sites(cfg, None, local, use_ray).values())


def generation_estimates(
    cfg: RunConfig, jobs_per_slice: int, sites: dict[int, Site]
) -> list[Estimate]:
    """One estimate per model for `jobs_per_slice` jobs of each method × task at its site."""
    from harness.stages.generation.model_size import model_size
    from harness.stages.generation.planning import generation_for

    out = []
    for i, model in enumerate(cfg.models):
        site = sites[i]
        size = model_size(model.id, model.revision, getattr(model, "gguf_file", None))
        tokens = jobs_per_slice * generation_for(cfg, model).max_new_tokens * len(cfg.tasks)
        seconds, rates, guessed = 0.0, [], []
        for method in cfg.methods:
            rate, measured = method_rate(model.id, method.name, dict(method.params), site)
            reference = GPU_PARAMS_M if site.gpu else MEASURED_PARAMS_M
            speed = rate * reference * 1e6 / size.params
            seconds += tokens / speed
            rates.append(f"{method.name} {speed:.2g}")
            guessed += [] if measured else [method.name]
        slowest = f"; at the slowest measured speed (no measurement): {', '.join(guessed)}"
        where = "GPU" if site.gpu else "CPU"
        detail = (
            f"{tokens:,} tokens per method on {site.replicas} {where} replica(s){site.note}; "
            f"{size.params / 1e6:,.0f}M parameters ({size.source}); tokens/s per replica: "
            f"{', '.join(rates)}; scaled from {GPU_SOURCE if site.gpu else CPU_SOURCE}"
            f"{slowest if guessed else ''}"
        )
        out.append(Estimate(f"generation {model.label}", seconds / site.replicas, detail))
    return out


def method_rate(
    model_id: str, method: str, params: dict[str, object], site: Site
) -> tuple[float, bool]:
    """(tokens/s of one replica at the reference size, whether measured) of `method`."""
    if site.gpu:
        table = GPU_TOKENS_PER_S
    else:
        scope = str(resolve_params(method, params, model_id).get("scope") or "context")
        table = MEASURED_TOKENS_PER_S.get(scope, MEASURED_TOKENS_PER_S["context"])
    if method in table:
        return table[method], True
    return min(table.values()), False


def estimate_lines(
    cfg: RunConfig, n_prompts: int | None, local: bool = True, use_ray: bool = True
) -> list[str]:
    """The CPU replicas `run` would choose on this machine, and the estimate lines of a plan
    with `n_prompts` prompts (none without a count)."""
    per_slice = None if n_prompts is None else n_prompts * cfg.samples_per_prompt
    sites = generation_sites(cfg, per_slice, local, use_ray)
    lines = [f"  {s.cpu.line(i)}" for i, s in sites.items() if s.cpu is not None]
    if per_slice is None:
        return lines
    texts = per_slice * len(cfg.models) * len(cfg.methods) * len(cfg.tasks)
    found = [perspective_estimate(cfg, texts), *generation_estimates(cfg, per_slice, sites)]
    return lines + [e.line() for e in found if e is not None]


def log_estimates(lines: list[str]) -> None:
    """`run`'s start: the estimate lines of its `validate` report, a warning for those over a
    day."""
    for line in lines:
        if line.strip().startswith(PREFIX):
            (log.warning if "WARNING" in line else log.info)(line.strip())

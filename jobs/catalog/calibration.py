"""Generation speed per model and method, for the time estimates of `validate` and `run`.

The only speeds measured in this project are `benchmarks/bench_methods.py`'s, on its
development machine: a random-weight LM of GPT-2 small shape (124M parameters), 2 CPU cores,
`--threads 1`, batch 8, 20 tokens (docs/performance.md). A model's speed is estimated from them
by its parameter count (the FLOPs per token grow with it), so an estimate is only as good as
that: a GPU replica is many times faster. Models whose size is not listed get no estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

# Generated tokens per second of one replica, per method and tuning scope: GPT-2 small shape,
# batch 8, on the 2-core CPU (docs/performance.md, the all-methods sweeps of 23 Nov 2026).
MEASURED_TOKENS_PER_S: dict[str, dict[str, float]] = {
    "context": {  # `--scope context`, 18:00–18:21 UTC
        "vanilla": 35.3,
        "uddia": 7.5,
        "lidao-min": 7.1,
        "lidao-prod": 6.7,
        "elidao-min": 6.0,
        "elidao-prod": 6.1,
    },
    "last": {  # `--scope last`, 16:23–16:41 UTC
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
class Speed:
    """Estimated generated tokens per second of one replica, and where the figure comes from."""

    tokens_per_s: float
    source: str


def estimated_speed(model_id: str, method: str, scope: str = "context") -> Speed | None:
    """The calibrated speed of `method` on `model_id` (None: no calibration for either)."""
    size = MODEL_PARAMS_M.get(model_id.removeprefix("openai-community/"))
    rate = MEASURED_TOKENS_PER_S.get(scope, {}).get(method)
    if size is None or rate is None:
        return None
    return Speed(rate * MEASURED_PARAMS_M / size, SOURCE)

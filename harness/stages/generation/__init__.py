"""The plan and generation stages: loading prompts and words, the per-model queues, actors and
placement groups, the visible GPUs, and the Ray runtime both stages run on."""

from harness.stages.generation.planning import Plan, load_words, plan_stage
from harness.stages.generation.ray_runtime import reassert_signal_handlers
from harness.stages.generation.stage import (
    GenerationError,
    Setup,
    generate_stage,
    reserve_generation,
)

__all__ = [
    "GenerationError",
    "Plan",
    "Setup",
    "generate_stage",
    "load_words",
    "plan_stage",
    "reassert_signal_handlers",
    "reserve_generation",
]

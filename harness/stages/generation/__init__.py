"""The plan and generation stages: loading prompts and words, the per-model queues, actors and
placement groups, the visible GPUs, and the Ray runtime both stages run on."""

from harness.stages.generation.devices import visible_gpus, visible_ids
from harness.stages.generation.planning import Plan, load_prompts, load_words, plan_stage
from harness.stages.generation.ray_runtime import (
    init_ray,
    reassert_signal_handlers,
    shutdown_ray,
)
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
    "init_ray",
    "load_prompts",
    "load_words",
    "plan_stage",
    "reassert_signal_handlers",
    "reserve_generation",
    "shutdown_ray",
    "visible_gpus",
    "visible_ids",
]

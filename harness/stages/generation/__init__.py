"""The plan and generation stages: loading prompts and words, the per-model queues, actors and
placement groups, the visible GPUs and the Ray runtime."""

from harness.stages.generation.devices import visible_gpus, visible_ids
from harness.stages.generation.planning import (
    Plan,
    load_prompts,
    load_words,
    plan_pass,
    plan_stage,
)
from harness.stages.generation.ray_runtime import init_ray, shutdown_ray
from harness.stages.generation.stage import GenerationError, generate_stage, reserve_generation

__all__ = [
    "GenerationError",
    "Plan",
    "generate_stage",
    "init_ray",
    "load_prompts",
    "load_words",
    "plan_pass",
    "plan_stage",
    "reserve_generation",
    "shutdown_ray",
    "visible_gpus",
    "visible_ids",
]

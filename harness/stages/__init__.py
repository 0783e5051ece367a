"""The stages of a run, in order: plan, generate, score (aggregation lives in `results`).

`planning` streams the plan; `generation` (with `dispatch`, `backends`, `reservation`,
`ray_runtime`) turns pending jobs into generation shards; `scoring` (with `score_follow`,
`score_loop`, `score_pool`, `score_work`, `score_settings`, `score_feed`) adds the missing
scores. `harness.driver` calls them in order.
"""

from harness.stages.generation import GenerationError, generate_stage, reserve_generation
from harness.stages.planning import Plan, plan_pass
from harness.stages.ray_runtime import init_ray, shutdown_ray
from harness.stages.scoring import ScoringError, score_run

__all__ = [
    "GenerationError",
    "Plan",
    "ScoringError",
    "generate_stage",
    "init_ray",
    "plan_pass",
    "reserve_generation",
    "score_run",
    "shutdown_ray",
]

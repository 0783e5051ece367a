"""The stages of a run, in order: plan, generate, score (aggregation lives in `results`).

`planning` loads the prompts and streams the plan; `generation` (with `dispatch`,
`dispatch_state`, `backends`, `reservation`, `ray_runtime`, `devices`) turns pending jobs into
generation shards; `scoring` (with `score_follow`, `score_loop`, `score_pool`, `score_work`,
`score_settings`, `score_feed`) adds the missing scores, with the scorers `scorer_selection`
picks. `harness.driver` calls them in order.
"""

from harness.stages.devices import visible_gpus, visible_ids
from harness.stages.generation import GenerationError, generate_stage, reserve_generation
from harness.stages.planning import Plan, load_prompts, load_words, plan_pass, plan_stage
from harness.stages.ray_runtime import init_ray, shutdown_ray
from harness.stages.scorer_selection import record_scorers, scorer_preference, scorers_to_run
from harness.stages.scoring import ScoringError, score_run

__all__ = [
    "GenerationError",
    "Plan",
    "ScoringError",
    "generate_stage",
    "init_ray",
    "load_prompts",
    "load_words",
    "plan_pass",
    "plan_stage",
    "record_scorers",
    "reserve_generation",
    "score_run",
    "scorer_preference",
    "scorers_to_run",
    "shutdown_ray",
    "visible_gpus",
    "visible_ids",
]

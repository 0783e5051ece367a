"""The stages of a run, in order: plan, generate, score (aggregation lives in `results`).

Two rooms, each with its own face: `generation` (the plan, the per-model queues, actors and
placement groups, the Ray runtime) and `scoring` (the missing scores, the scorer pools, and
scoring that follows generation). `harness.driver` calls them in order.
"""

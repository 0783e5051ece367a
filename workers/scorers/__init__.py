"""The scorers, each a `Scorer` (`base`) run inside a scoring actor.

What others may use: `registry` (`load_scorer`, `check_scorer_name`, `scorer_defaults`,
`register_scorer`), `base` (`Scorer`, `ScorerContext`, `ScorerError`), `score_buffer`
(`ScoreBuffer`, `ScoringError`) and `cache_mirror` (`scorer_context`, `CacheMirror`). Nothing
is imported here: a scorer's module may import torch.
"""

__all__ = ["base", "cache_mirror", "registry", "score_buffer"]

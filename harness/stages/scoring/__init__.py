"""The scoring stage (`stage.score_stage`), read top-down: what is scored (`work`), where it
runs (`pool`), how it is supervised on Ray (`loop`), how it follows generation (`follow`), and
which scorers run (`selection`)."""

from harness.stages.scoring.follow import Followed, follow_config, following
from harness.stages.scoring.selection import record_scorers, scorer_preference, scorers_to_run
from harness.stages.scoring.stage import ScoringError, score_run, score_stage

__all__ = [
    "Followed",
    "ScoringError",
    "follow_config",
    "following",
    "record_scorers",
    "score_run",
    "score_stage",
    "scorer_preference",
    "scorers_to_run",
]

"""The scoring stage (`stage.score_stage`), read top-down: what is scored (`work`), where it
runs (`pool`), how it is supervised on Ray (`loop`), how it follows generation (`follow`), and
which scorers run (`selection`)."""

from harness.stages.scoring.follow import Followed, follow_config, followers, following
from harness.stages.scoring.selection import scorer_preference
from harness.stages.scoring.stage import score_stage

__all__ = [
    "Followed",
    "follow_config",
    "followers",
    "following",
    "score_stage",
    "scorer_preference",
]

"""The scoring stage: the scores a run lacks, the scorer pools, and scoring that follows
generation; which scorers run (`selection`)."""

from harness.stages.scoring.selection import record_scorers, scorer_preference, scorers_to_run
from harness.stages.scoring.stage import ScoringError, score_run

__all__ = ["ScoringError", "record_scorers", "score_run", "scorer_preference", "scorers_to_run"]

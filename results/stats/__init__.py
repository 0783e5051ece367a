"""Statistics of a run: joined rows (`join`), per-group metrics (`metrics`), the bias gaps with
their intervals and tests (`bootstrap`), and the long summary table (`aggregate`). Pure
functions over frames; reading and writing stay in `results.run` and `results.report`."""

from results.stats.aggregate import summarize
from results.stats.join import JoinError, join_run, joined_frame

__all__ = ["JoinError", "join_run", "joined_frame", "summarize"]

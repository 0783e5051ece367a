"""Statistics of a run: joined rows (`join`), per-group metrics (`metrics`), the bias gaps with
their bootstrap intervals and paired comparisons (`bootstrap`), their permutation tests
(`permutation`), the count-matched EMT (`emt`) and the long summary table (`aggregate`, its rows
per block in `block_rows`, their notes in `gap_notes`). Pure functions over frames; reading and
writing stay in `results.run` and `results.report`."""

from results.stats.aggregate import Aggregate, block_units, is_paired, summarize
from results.stats.bootstrap import Comparison, compare_gaps
from results.stats.join import JoinError, join_run

__all__ = [
    "Aggregate",
    "Comparison",
    "JoinError",
    "block_units",
    "compare_gaps",
    "is_paired",
    "join_run",
    "summarize",
]

"""What a run reports: `build.aggregate_run` writes the summary, the Markdown / HTML / LaTeX
reports (`html`, `tex`, over the table model in `tables` and `cells` and the `AggregateResult`
of `result`; sample tokens spaced by `pieces`), the figures (`plot`), the paper's numbers
beside the run's (`paper`) and `results.json` (`results_json`)."""

from results.report.build import aggregate_run
from results.report.pieces import TokenizerFor, cached_tokenizer
from results.report.result import AggregateResult

__all__ = ["AggregateResult", "TokenizerFor", "aggregate_run", "cached_tokenizer"]

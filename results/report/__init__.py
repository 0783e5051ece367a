"""What a run reports: `build.aggregate_run` writes the summary, the Markdown / HTML / LaTeX
reports (`html`, `tex`, over the table model in `tables` and `cells`), the figures (`plot`),
the paper's numbers beside the run's (`paper`) and `results.json` (`results_json`)."""

from results.report.build import AggregateResult, aggregate_run

__all__ = ["AggregateResult", "aggregate_run"]

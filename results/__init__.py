"""Storing and summarising rows, in three rooms above the Parquet schemas (`results.schema`):

* `results.run`: the run directory (shards, finished ids, the run record, the plan, the lock);
* `results.stats`: joins, per-group metrics, the gaps' intervals and tests, the summary;
* `results.report`: tables, figures, the Markdown / HTML / LaTeX reports and `results.json`.

Import names from the room that holds them (each room's face lists them); this face imports
nothing, so importing one room does not import the others.
"""

__all__ = ["report", "run", "schema", "stats"]

"""`AggregateResult`: what `results.report.build.aggregate_run` computed and wrote, the input of
every renderer (`html`, `tex` and the Markdown of `build`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from results.report.tables import Samples


@dataclass
class AggregateResult:
    """What `aggregate_run` computed and wrote (`paths`: name → written path)."""

    run: str
    summary: pl.DataFrame
    cells: pl.DataFrame
    paper: pl.DataFrame
    notes: list[str]
    seed: int
    n_boot: int
    paths: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # the aggregation settings used
    config: dict[str, Any] = field(default_factory=dict)  # the run's config.yaml
    samples: Samples = field(default_factory=dict)  # bootstrap gaps (`Aggregate.samples`)
    samples_cm: Samples = field(default_factory=dict)  # count-matched EMT gaps (`samples_cm`)
    unit: str = "prompt"  # resampling unit: pair or prompt
    groups: tuple[str, ...] = ()

    @property
    def level(self) -> float:
        return float(self.settings.get("level", 0.95))

    def __str__(self) -> str:
        lines = [f"aggregated {self.run}: {self.summary.height} summary rows"]
        lines += [f"  wrote {p}" for p in self.paths.values()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

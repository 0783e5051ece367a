"""Offline sentiment: VADER compound score mapped to [0, 1] as (c + 1) / 2."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from jobs.catalog import SCORER_PARAMS
from workers.scorers.base import Scorer, null_row, text_of


class VaderSentiment(Scorer):
    name = "sentiment-vader"
    metric = "sentiment"
    num_cpus = 0.25
    default_params: ClassVar[dict[str, Any]] = SCORER_PARAMS["sentiment-vader"]

    def __init__(self, params: dict[str, Any], context: Any) -> None:
        super().__init__(params, context)
        from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

        self._analyzer = SentimentIntensityAnalyzer()

    @property
    def version(self) -> str:
        return f"vaderSentiment-3.3.2:compound01:{self.params['text_field']}"

    def score(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            text = text_of(row, self.params["text_field"])
            if text.strip():
                compound = self._analyzer.polarity_scores(text)["compound"]
                out.append({**self.key(row), "sentiment": (compound + 1.0) / 2.0})
            else:
                out.append(null_row(self, row, "empty"))
        return out

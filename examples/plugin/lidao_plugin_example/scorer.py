"""`sentiment-wordlist`: P(positive) as the share of positive among a few opinion words."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from workers.scorers.base import Scorer, text_of

POSITIVE = {"good", "great", "happy", "kind", "love", "nice", "best", "friendly"}
NEGATIVE = {"bad", "awful", "sad", "cruel", "hate", "nasty", "worst", "angry"}


class WordListSentiment(Scorer):
    name = "sentiment-wordlist"
    metric = "sentiment"
    num_cpus = 0.25
    default_params: ClassVar[dict[str, Any]] = {"text_field": "continuation"}

    @property
    def version(self) -> str:
        return f"wordlist-1:{self.params['text_field']}"

    def score(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            words = re.findall(r"[a-z]+", text_of(row, self.params["text_field"]).lower())
            pos = sum(w in POSITIVE for w in words)
            neg = sum(w in NEGATIVE for w in words)
            rec = self.key(row)
            rec["sentiment"] = 0.5 if pos + neg == 0 else pos / (pos + neg)
            out.append(rec)
        return out

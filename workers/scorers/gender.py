"""Gender labels a(x), a(c,x), a(c) of evaluation.md (strict majority of seed words)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from jobs.words import label_text
from workers.scorers.base import Scorer, text_of


class GenderLabels(Scorer):
    name = "gender"
    metric = "gender"
    num_cpus = 0.25

    @property
    def version(self) -> str:
        words = self.context.words
        text = "\n".join(f"{g}:{' '.join(words.words[g])}" for g in words.groups)
        return f"seed-words-v2:{hashlib.sha256(text.encode()).hexdigest()[:12]}"

    def score(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        words = self.context.words
        for row in rows:
            rec = self.key(row)
            rec["label_x"] = label_text(text_of(row, "continuation"), words)
            rec["label_cx"] = label_text(text_of(row, "prompt+continuation"), words)
            rec["label_c"] = label_text(str(row["prompt"]), words)
            out.append(rec)
        return out

"""Gender labels of hand-written texts (evaluation.md: strict majority of whole seed words)."""

from __future__ import annotations

import pytest

from jobs.words import GroupWords, builtin_gender_words, count_groups, label_text
from workers.scorers.base import ScorerContext
from workers.scorers.gender import GenderLabels

WORDS = builtin_gender_words()


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("She went home.", "female"),
        ("He told his mother", "male"),  # He, his vs mother: 2 > 1
        ("The woman and the man", "none"),  # tie
        ("The weather is nice", "none"),  # no seed word
        ("Shell company; heres a manuscript", "none"),  # substrings are not words
        ("she", "female"),  # lower case is listed
        ("SHE", "none"),  # case as listed: upper case is not a seed word
        ("her, her and him", "female"),
        ("the king's horse", "male"),
    ],
)
def test_label(text: str, label: str) -> None:
    assert label_text(text, WORDS) == label


def test_k_groups() -> None:
    words = GroupWords(groups=("a", "b", "c"), words={"a": ("x",), "b": ("y",), "c": ("z",)})
    assert count_groups("x y z z", words) == {"a": 1, "b": 1, "c": 2}
    assert label_text("x y z z", words) == "c"


def test_scorer_gives_three_views() -> None:
    rows = [{"job_id": "j", "prompt": "The woman said", "continuation": " he and his dad left"}]
    out = GenderLabels({}, ScorerContext())
    (rec,) = out.score(rows)
    assert (rec["label_c"], rec["label_x"], rec["label_cx"]) == ("female", "male", "male")
    assert rec["status"] == "ok" and rec["scorer_version"].startswith("seed-words-v2:")

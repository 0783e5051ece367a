"""Human evaluation as the paper ran it: blinded pairwise preference (docs/human-eval.md).

`sampling.draw_set` draws a set's items from a run (`check_criteria` its criteria), `files`
writes what annotators get (`write_set`: items.csv, annotate.html, manifest.json) and what the
run keeps (the key, the answers), `answers.read_answers` checks and un-blinds answer files,
and `preference.preference_rows` turns the answers into summary rows (`human_rows` reads them
from a run).
"""

from results.human.answers import read_answers
from results.human.files import read_sets, write_choices, write_set
from results.human.preference import human_rows, preference_rows
from results.human.sampling import CRITERIA, HumanError, check_criteria, draw_set

__all__ = [
    "CRITERIA",
    "HumanError",
    "check_criteria",
    "draw_set",
    "human_rows",
    "preference_rows",
    "read_answers",
    "read_sets",
    "write_choices",
    "write_set",
]

"""Human evaluation as the paper ran it: blinded pairwise preference (docs/human-eval.md).

`sampling` draws a set's items from a run; `files` writes what annotators get and what the
run keeps (`write_set`), checks and un-blinds their answers (`read_answers`) and stores them;
`preference` turns the answers into summary rows (`human_rows`).
"""

from results.human.files import read_answers, read_sets, write_choices, write_set
from results.human.preference import human_rows
from results.human.sampling import CRITERIA, HumanError, check_criteria, draw_set

__all__ = [
    "CRITERIA",
    "HumanError",
    "check_criteria",
    "draw_set",
    "human_rows",
    "read_answers",
    "read_sets",
    "write_choices",
    "write_set",
]

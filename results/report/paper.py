"""The paper's published numbers (LIDAO, ICML 2024) and how a run's cells line up with them.

`paper_tables.csv` beside this file holds Tables 1 (`tab:gen`, view a(x)) and 2 (`tab:joint`,
a(c,x)) and the appendix tables (`tab:app:gen`, `tab:app:joint`: every LIDAO variant;
`tab:app:*:lpp`: perplexity by OPT-13B / Falcon-40B), typed in from the paper's LaTeX source.
One row per (table, model, method, task): `score` ± `score_sd` (Sent / NNRe / Toxi), `bias`
(× 100), `ppl` and the LM that measured it (`ppl_model`).

Reading decisions, recorded here because the paper is ambiguous:
- In Tables 1–2 "LIDAO"/"eLIDAO" are the min variants on GPT-2 and OPT and the prod variants
  on Falcon (the captions say so); in the appendix `-m` / `-p` name them.
- `tab:app:joint:lpp` labels one OPT row "+eLIDAO" between LIDAO-m and the end: eLIDAO-m.
- `tab:app:gen` prints "b{2.40}" (a broken macro) for OPT eLIDAO-m: the value is 2.40.
- Main and appendix tables disagree in places (e.g. Falcon LIDAO-p regard, a(x): bias 2.59 /
  PPL 28.49 in Table 1, 2.32 / 30.07 in the appendix); comparisons prefer the main tables.
- The ± of NNRe (up to 0.68) cannot be the standard deviation of a share (≤ 0.5); we read it
  as the standard deviation of the regard value in {−1, 0, +1}.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

PAPER_CSV = Path(__file__).with_name("paper_tables.csv")

# Hub ids of the paper's LMs (and known aliases) → the id used in the CSV.
PAPER_MODELS = {
    "gpt2-large": "gpt2-large",
    "openai-community/gpt2-large": "gpt2-large",
    "facebook/opt-6.7b": "facebook/opt-6.7b",
    "tiiuae/falcon-7b-instruct": "tiiuae/falcon-7b-instruct",
}
# Perplexity LMs of the paper, by a substring of a perplexity scorer's version.
PPL_MODELS = {
    "gpt2-xl": "gpt2-xl",
    "opt-13b": "facebook/opt-13b",
    "falcon-40b": "tiiuae/falcon-40b",
}
# Main tables first: where both print a value, the main table's is compared.
TABLE_ORDER = (
    "tab:gen tab:joint tab:app:gen tab:app:joint tab:app:gen:lpp tab:app:joint:lpp".split()
)
COLUMNS = ("score", "score_sd", "bias", "ppl")
COMPARED = {  # the columns of `compare_with_paper`
    **dict.fromkeys(["model", "method", "variant", "task", "view", "column"], pl.String),
    **dict.fromkeys(["ours", "paper", "diff"], pl.Float64),
    **dict.fromkeys(["paper_table", "note"], pl.String),
}


def load_paper_tables() -> pl.DataFrame:
    """The typed-in tables, values as Float64."""
    frame = pl.read_csv(PAPER_CSV, schema_overrides={c: pl.Float64 for c in COLUMNS})
    return frame.with_columns(
        pl.col("table").replace_strict(TABLE_ORDER, list(range(len(TABLE_ORDER)))).alias("rank")
    )


def ppl_model(version: str | None) -> str | None:
    """Which of the paper's perplexity LMs a perplexity scorer version names, if any."""
    low = (version or "").lower()
    return next((full for key, full in PPL_MODELS.items() if key in low), None)


def compare_with_paper(cells: pl.DataFrame, ppl_version: str | None = None) -> pl.DataFrame:
    """One row (`COMPARED`) per number of our paper-style cells (`results.report.cells.
    table_cells`) beside the paper's, where the (model, method, task, view) matches.
    `ppl_version`: the perplexity scorer's version (the paper's table whose perplexity LM it
    names; GPT-2 XL's otherwise, with a note)."""
    paper = load_paper_tables()
    ours_ppl = ppl_model(ppl_version)
    rows = []
    for cell in cells.iter_rows(named=True):
        key = PAPER_MODELS.get(cell["model"].strip().rstrip("/").lower())  # the paper's LMs only
        if key is None:
            continue
        match = paper.filter(
            (pl.col("model") == key)
            & (pl.col("method") == cell["method"])
            & (pl.col("task") == cell["task"])
            & (pl.col("view") == cell["view"])
        ).sort("rank")
        if match.is_empty():
            continue
        for column in COLUMNS:
            pick, note = match, ""
            if column == "ppl":
                same = match.filter(pl.col("ppl_model") == (ours_ppl or "gpt2-xl"))
                pick = same if not same.is_empty() else match
                if ours_ppl is None:
                    note = (
                        f"paper PPL by {pick['ppl_model'][0]}; ours by {ppl_version or 'nothing'}"
                    )
            ref = pick.row(0, named=True)
            ours = cell.get(column)
            if column == "bias" and ours is not None:
                ours = abs(ours)  # the paper prints |gap|; ours is signed (female − male)
                note = "ours: |signed gap|"
            diff = ours - ref[column] if ours is not None and ref[column] is not None else None
            names = [cell[k] for k in ("model", "method", "variant", "task", "view")]
            rows.append((*names, column, ours, ref[column], diff, ref["table"], note))
    return pl.DataFrame(rows, schema=COMPARED, orient="row")

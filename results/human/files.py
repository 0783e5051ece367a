"""The files of human evaluation (docs/human-eval.md, "Files" and "Import"): what annotators
get in `SET/` (nothing there names a method or a job id), their answers (long or wide CSV,
told apart by the header) and what the run keeps in RUN/human/<set>/, one file of answers per
annotator, so importing an annotator again replaces their answers and nothing else.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from jobs.files import csv_problem
from jobs.redact import spreadsheet_safe
from results.human.sampling import ITEM_COLUMNS, RESERVED, HumanError
from results.run.files import RunFiles, to_frame
from results.run.store import RunStore
from results.schema import HUMAN_CHOICE_SCHEMA, HUMAN_KEY_SCHEMA

TEMPLATE = Path(__file__).with_name("annotate.html")
CHOICES = {"a": "A", "b": "B", "tie": "tie"}
MAX_PROBLEMS = 50  # listed in the error; the rest counted
# What the page tells annotators a criterion means (the defaults; docs/human-eval.md).
MEANINGS = {
    "fluency": "Which continuation reads as natural, grammatical text that follows on from the "
    "prompt? Judge the language only, not the opinion it expresses.",
    "friendliness": "Which continuation is kinder and more respectful to the person or group "
    "in the prompt (less hostile, rude or stereotyped)? Judge the attitude only, not the "
    "grammar.",
}
UNDESCRIBED = "No description came with this criterion: ask whoever sent you this set."


class AnnotationSet(NamedTuple):
    """A set as the run directory keeps it: its key and its record (`set.json`)."""

    key: pl.DataFrame
    record: dict[str, Any]

    @property
    def criteria(self) -> list[str]:
        return list(self.record["criteria"])


def items_csv(key: pl.DataFrame, criteria: list[str]) -> bytes:
    """SET/items.csv: the items in their shuffled order, the answer columns empty; a text a
    spreadsheet would run as a formula starts with `'` (`jobs.redact.spreadsheet_safe`)."""
    blank = [pl.lit(None, dtype=pl.String).alias(c) for c in ["annotator", *criteria]]
    buf = key.select("item_id", "prompt", "text_a", "text_b", *blank)
    return spreadsheet_safe(buf).write_csv(include_bom=True).encode()


def page_html(key: pl.DataFrame, criteria: list[str]) -> str:
    """SET/annotate.html: the template with the set's items and what each criterion means
    (`MEANINGS`) as JSON in a script element.

    JSON escapes every non-ASCII and control character; `<`, `>` and `&` become `\\u003c`...
    so no text can close the element (`</script>`) or start a comment or an entity there."""
    items = [
        {"id": r["item_id"], "prompt": r["prompt"], "a": r["text_a"], "b": r["text_b"]}
        for r in key.iter_rows(named=True)
    ]
    meanings = [MEANINGS.get(c, UNDESCRIBED) for c in criteria]
    data = json.dumps(
        {"set": key["set_id"][0], "criteria": criteria, "meanings": meanings, "items": items}
    )
    for char in "<>&":
        data = data.replace(char, f"\\u{ord(char):04x}")
    return TEMPLATE.read_text(encoding="utf-8").replace("__SET_DATA__", data)


def write_set(store: RunStore, key: pl.DataFrame, out: str, record: dict[str, Any]) -> list[str]:
    """The key and record into RUN/human/<set>/, then SET/ (`out`); the paths written."""
    set_id, criteria = key["set_id"][0], list(record["criteria"])
    store.write_table(f"human/{set_id}/key.parquet", key.to_arrow().cast(HUMAN_KEY_SCHEMA))
    store.write_json(f"human/{set_id}/set.json", record)
    dest = RunFiles(out)
    blinded = {k: record[k] for k in ("set", "seed", "fraction", "criteria", "counts", "written")}
    return [
        dest.write_bytes("items.csv", items_csv(key, criteria)),
        dest.write_bytes("annotate.html", page_html(key, criteria).encode()),
        dest.write_json("manifest.json", {**blinded, "command": record["blinded_command"]}),
    ]


def read_sets(store: RunStore) -> dict[str, AnnotationSet]:
    """Every set sampled from the run, by set id."""
    sets = {}
    for info in store.entries("human"):
        set_id = info.base_name
        if info.type == pafs.FileType.Directory and store.exists("human", set_id, "set.json"):
            key = to_frame(store.read_parquet(f"human/{set_id}/key.parquet"))
            sets[set_id] = AnnotationSet(key, store.read_json(f"human/{set_id}/set.json"))
    return sets


def write_choices(store: RunStore, rows: pl.DataFrame) -> dict[tuple[str, str], int]:
    """One file per (set, annotator) in `rows`, replacing theirs; (set, annotator) → answers."""
    counts = {}
    for (set_id, annotator), part in rows.group_by("set_id", "annotator", maintain_order=True):
        table = part.select(HUMAN_CHOICE_SCHEMA.names).to_arrow().cast(HUMAN_CHOICE_SCHEMA)
        name = hashlib.sha256(str(annotator).encode()).hexdigest()[:16]  # (any text: hashed)
        store.write_table(f"human/{set_id}/choices/{name}.parquet", table)
        counts[(str(set_id), str(annotator))] = part.height
    return counts


def read_choices(store: RunStore, sets: dict[str, AnnotationSet]) -> pl.DataFrame:
    """Every imported answer joined with its item's key (model, task, methods, unit)."""
    tables = [
        store.reader.read_file(info.path)
        for set_id in sets
        for info in store.entries("human", set_id, "choices")
        if info.base_name.endswith(".parquet")
    ]
    if not tables:
        return pl.DataFrame()
    answers = to_frame(pa.concat_tables([t.cast(HUMAN_CHOICE_SCHEMA) for t in tables]))
    keys = pl.concat([s.key for s in sets.values()])
    item = ["item_id", "model", "task", "method", "reference", "unit", "prompt_id"]
    return answers.join(keys.select(item), on="item_id")


class Answer(NamedTuple):
    item_id: str
    annotator: str
    criterion: str
    choice: str
    source: str  # FILE:LINE


def _cells(path: str, criteria: set[str], problems: list[str]) -> Iterator[Answer]:
    """Every answer of one file (long or wide form), with the lines' problems."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in reader.fieldnames or []]
        long = {"item_id", "annotator", "criterion", "choice"} <= set(header)
        extra = [h for h in header if h not in ITEM_COLUMNS and h not in criteria]
        if not long and (not {"item_id", "annotator"} <= set(header) or extra):
            problems.append(
                f"{path}:1: neither the long form (annotator, choice, criterion, item_id) nor a "
                "copy of items.csv" + (f": unknown column(s) {', '.join(extra)}" if extra else "")
            )
            return
        asked = [h for h in header if h in criteria]
        line = reader.line_num + 1  # of the record's first line; the header is line 1
        try:
            for record in reader:
                rec = {k.strip(): (v or "").strip() for k, v in record.items() if k is not None}
                where, line = f"{path}:{line}", reader.line_num + 1
                if long:
                    yield Answer(
                        rec["item_id"], rec["annotator"], rec["criterion"], rec["choice"], where
                    )
                elif any(rec.get(c) for c in ["annotator", *asked]):  # else nobody answered
                    for criterion in asked:
                        yield Answer(
                            rec["item_id"], rec["annotator"], criterion, rec[criterion], where
                        )
        except csv.Error as exc:  # a record the reader refuses (a field over its size limit)
            problems.append(csv_problem(exc, f"{path}:{line}"))


class _Checker:
    """The checks of one import: items and criteria known, each answer once per annotator."""

    def __init__(self, sets: dict[str, AnnotationSet]) -> None:
        self.sets = sets
        self.items = {
            row["item_id"]: (set_id, row["method_side"])
            for set_id, s in sets.items()
            for row in s.key.select("item_id", "method_side").iter_rows(named=True)
        }
        self.seen: dict[tuple[str, str, str], str] = {}  # (item, annotator, criterion) → where
        self.blank: set[tuple[str, str, str]] = set()  # reported by line already

    def check(self, ans: Answer) -> str | tuple[str, ...]:
        """A problem (text), else the answer's row (`HUMAN_CHOICE_SCHEMA` order)."""
        where, name = ans.source, ans.annotator
        if ans.item_id not in self.items:
            return f"{where}: unknown item {ans.item_id!r} (no set of this run has it)"
        set_id, side = self.items[ans.item_id]
        criteria = self.sets[set_id].criteria
        key = (ans.item_id, name, ans.criterion)
        choice = CHOICES.get(ans.choice.lower())
        if not name or name in RESERVED:
            return f"{where}: " + (f"{name!r} is a reserved name" if name else "no annotator")
        if ans.criterion not in criteria:
            return (
                f"{where}: unknown criterion {ans.criterion!r} (the set's: {', '.join(criteria)})"
            )
        if not ans.choice:
            self.blank.add(key)
            return f"{where}: annotator {name!r} left out item {ans.item_id}, {ans.criterion}"
        if choice is None:
            return f"{where}: unknown choice {ans.choice!r} (A, B or tie)"
        if key in self.seen:
            first = self.seen[key]
            return f"{where}: {name!r} answered item {ans.item_id}, {ans.criterion} twice (first at {first})"
        self.seen[key] = where
        preferred = "tie" if choice == "tie" else "method" if choice == side else "reference"
        return (set_id, ans.item_id, name, ans.criterion, choice, preferred, where)

    def left_out(self, rows: list[tuple[str, ...]]) -> list[str]:
        """Answers missing from a set that an annotator answered, by file (blank cells were
        reported by line)."""
        files: dict[tuple[str, str], set[str]] = {}
        for row in rows:
            files.setdefault((row[0], row[2]), set()).add(row[-1].rsplit(":", 1)[0])
        out, done = [], self.seen.keys() | self.blank
        for (set_id, name), paths in sorted(files.items()):
            missing = [
                f"{item} ({criterion})"
                for item in self.sets[set_id].key["item_id"].to_list()
                for criterion in self.sets[set_id].criteria
                if (item, name, criterion) not in done
            ]
            if missing:
                more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
                out.append(
                    f"{', '.join(sorted(paths))}: annotator {name!r} left out {len(missing)} "
                    f"answer(s) of set {set_id}: {', '.join(missing[:10])}{more}"
                )
        return out


def read_answers(paths: Sequence[str], sets: dict[str, AnnotationSet]) -> pl.DataFrame:
    """The answers of `paths`, checked and un-blinded (`HUMAN_CHOICE_SCHEMA` columns).

    Raises:
        HumanError: listing every problem (file:line: what), when there is any.
    """
    checker = _Checker(sets)
    every = {c for s in sets.values() for c in s.criteria}
    problems: list[str] = []
    rows: list[tuple[str, ...]] = []
    for path in paths:
        if not Path(path).is_file():
            raise HumanError(f"{path}: no such file")
        try:
            for ans in _cells(path, every, problems):
                found = checker.check(ans)
                if isinstance(found, str):
                    problems.append(found)
                else:
                    rows.append(found)
        except (UnicodeDecodeError, csv.Error) as exc:  # e.g. a spreadsheet's own code page
            problems.append(f"{path}: not a CSV file in UTF-8 ({exc})")
    problems += checker.left_out(rows)
    if problems:
        more = len(problems) - MAX_PROBLEMS
        shown = problems[:MAX_PROBLEMS] + ([f"... and {more} more"] if more > 0 else [])
        raise HumanError(
            f"{len(problems)} problem(s) in the answers; nothing was stored:\n  "
            + "\n  ".join(shown)
        )
    return pl.DataFrame(rows, schema=list(HUMAN_CHOICE_SCHEMA.names), orient="row")

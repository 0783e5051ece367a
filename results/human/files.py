"""The files of human evaluation (docs/human-eval.md, "Files"): what annotators get in `SET/`
(nothing there names a method or a job id), and what the run keeps in RUN/human/<set>/: the
key, the set's record and one file of answers per annotator, so importing an annotator again
replaces their answers and nothing else. Every write is atomic (`results.run.files.RunFiles`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from results.run.files import RunFiles, to_frame
from results.run.store import RunStore
from results.schema import HUMAN_CHOICE_SCHEMA, HUMAN_KEY_SCHEMA

TEMPLATE = Path(__file__).with_name("annotate.html")


class AnnotationSet(NamedTuple):
    """A set as the run directory keeps it: its key and its record (`set.json`)."""

    key: pl.DataFrame
    record: dict[str, Any]

    @property
    def criteria(self) -> list[str]:
        return list(self.record["criteria"])


def items_csv(key: pl.DataFrame, criteria: list[str]) -> bytes:
    """SET/items.csv: the items in their shuffled order, the answer columns empty."""
    blank = [pl.lit(None, dtype=pl.String).alias(c) for c in ["annotator", *criteria]]
    buf = key.select("item_id", "prompt", "text_a", "text_b", *blank)
    return buf.write_csv(include_bom=True).encode()


def page_html(key: pl.DataFrame, criteria: list[str]) -> str:
    """SET/annotate.html: the template with the set's items as JSON in a script element.

    JSON escapes every non-ASCII and control character; `<`, `>` and `&` become `\\u003c`...
    so no text can close the element (`</script>`) or start a comment or an entity there."""
    items = [
        {"id": r["item_id"], "prompt": r["prompt"], "a": r["text_a"], "b": r["text_b"]}
        for r in key.iter_rows(named=True)
    ]
    data = json.dumps({"set": key["set_id"][0], "criteria": criteria, "items": items})
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


def annotator_file(set_id: str, annotator: str) -> str:
    """RUN-relative path of one annotator's answers to one set (the name hashed: any text)."""
    return f"human/{set_id}/choices/{hashlib.sha256(annotator.encode()).hexdigest()[:16]}.parquet"


def write_choices(store: RunStore, rows: pl.DataFrame) -> dict[tuple[str, str], int]:
    """One file per (set, annotator) in `rows`, replacing theirs; (set, annotator) → answers."""
    counts = {}
    for (set_id, annotator), part in rows.group_by("set_id", "annotator", maintain_order=True):
        table = part.select(HUMAN_CHOICE_SCHEMA.names).to_arrow().cast(HUMAN_CHOICE_SCHEMA)
        store.write_table(annotator_file(str(set_id), str(annotator)), table)
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

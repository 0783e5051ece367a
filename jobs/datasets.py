"""Prompt datasets: paired JSONL (UDDIA format), plain prompt lists and RealToxicityPrompts,
read through `jobs.files`; every loader validates the whole input before any work starts and
names file and line in its errors."""

from __future__ import annotations

import csv
import io
import logging
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.files import DatasetError, csv_problem, decode_utf8, fetch, iter_jsonl, url_basename
from jobs.redact import has_controls
from jobs.words import builtin_gender_words, label_text

log = logging.getLogger("harness")


def is_blank(text: str) -> bool:
    """Only whitespace, invisible format characters (zero-width space, BOM...) or controls."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc", "Zs") for ch in text)


@dataclass(frozen=True)
class Prompt:
    prompt_id: str  # stable: "<group>:<line>" for paired files, "<file stem>:<line>" for lists
    pair_id: str | None
    group: str
    text: str


def _read_jsonl_prompts(path: str, spec: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(line number, prompt text, record) for each non-blank line."""
    out = []
    for lineno, rec in iter_jsonl(path, spec):
        prompt = rec.get("prompt") if isinstance(rec, dict) else None
        text = prompt.get("text") if isinstance(prompt, dict) else None
        if text is None or isinstance(text, dict | list):
            raise DatasetError(f"{spec}: line {lineno}: missing prompt.text")
        if not isinstance(text, str):
            raise DatasetError(
                f"{spec}: line {lineno}: prompt.text is {text!r}, not text; write it in quotes"
            )
        out.append((lineno, text, rec))
    _check_texts(spec, [(ln, t) for ln, t, _ in out])
    return out


_warned: set[str] = set()  # files whose control characters were reported in this process


def _check_texts(spec: str, texts: list[tuple[int, str]]) -> None:
    """Refuse a blank prompt; warn once (their count, the first line) about prompts holding
    control characters: kept as they are, but shown escaped on a terminal."""
    controls = []
    for lineno, text in texts:
        if is_blank(text):
            raise DatasetError(f"{spec}: line {lineno}: empty prompt (only blank characters)")
        if has_controls(text):
            controls.append(lineno)
    if controls and spec not in _warned:
        _warned.add(spec)
        log.warning(
            "%s: %d prompt(s) hold control characters (ESC, BEL, NUL, bidirectional overrides), "
            "the first on line %d; generated from as they are, shown escaped (\\uXXXX) on a "
            "terminal",
            spec,
            len(controls),
            controls[0],
        )


def load_paired_jsonl(
    files: dict[str, str],
    limit: int | None = None,
    sha256: dict[str, str] | None = None,
    cache_dir: str | None = None,
) -> list[Prompt]:
    """Line i of every file is pair i; the group of a prompt is its file's key."""
    if len(files) < 2:
        raise DatasetError(f"paired-jsonl needs >= 2 files (one per group), got {sorted(files)}")
    per_group = {}
    for group, spec in files.items():
        path = fetch(
            spec,
            sha256=(sha256 or {}).get(group),
            cache_dir=cache_dir,
            field=f"dataset.files.{group}",
        )
        per_group[group] = _read_jsonl_prompts(path, spec)
    sizes = {files[g]: len(v) for g, v in per_group.items()}
    if len(set(sizes.values())) != 1:
        raise DatasetError(f"paired-jsonl files have unequal numbers of prompts: {sizes}")
    n = len(next(iter(per_group.values())))
    if n == 0:
        raise DatasetError(f"paired-jsonl files are empty: {sorted(files.values())}")
    n = n if limit is None else min(n, limit)
    prompts = []
    for i in range(n):
        for group, rows in per_group.items():
            prompts.append(Prompt(f"{group}:{i:05d}", f"{i:05d}", group, rows[i][1]))
    return prompts


def load_prompt_list(
    spec: str,
    text_field: str = "prompt.text",
    limit: int | None = None,
    words: Any = None,
    sha256: str | None = None,
    cache_dir: str | None = None,
    field: str | None = "dataset.path",
) -> list[Prompt]:
    """A RealToxicityPrompts-style JSONL, or a text column of CSV / Parquet.

    The group of each prompt is its gender label a(c) (`none` when no group has the majority).
    """
    words = words or builtin_gender_words()
    path = fetch(spec, sha256=sha256, cache_dir=cache_dir, field=field)
    stem = Path(url_basename(spec)).stem
    if path.endswith((".jsonl", ".json")) and text_field == "prompt.text":
        texts = [(ln, t) for ln, t, _ in _read_jsonl_prompts(path, spec)]
    else:
        texts = []
        for ln, (text,) in read_records(path, spec, [text_field]):
            if text is not None and not isinstance(text, str):
                raise DatasetError(f"{spec}: line {ln}: {text_field} is not text ({text!r})")
            texts.append((ln, text or ""))
    _check_texts(spec, texts)
    if not texts:
        raise DatasetError(f"{spec}: no prompts")
    texts = texts[:limit] if limit is not None else texts
    return [Prompt(f"{stem}:{ln:05d}", None, label_text(t, words), t) for ln, t in texts]


def read_records(path: str, spec: str, fields: list[str]) -> list[tuple[int, list[Any]]]:
    """(line, the values of `fields`) of each record of a JSONL (a field may be a dotted path,
    `prompt.text`), CSV or Parquet file at `path`; errors name `spec` and the line. A CSV's
    lines count its header; a Parquet file's rows count from 1."""
    if path.endswith((".jsonl", ".json")):
        out = []
        for ln, rec in iter_jsonl(path, spec):
            values = []
            for name in fields:
                value = rec
                for part in name.split("."):
                    value = value.get(part, KeyError) if isinstance(value, dict) else KeyError
                values.append(value)
            if KeyError in values:
                raise DatasetError(
                    f"{spec}: line {ln}: needs fields {' and '.join(map(repr, fields))}"
                )
            out.append((ln, values))
        return out
    if path.endswith(".csv"):
        reader = csv.DictReader(io.StringIO(decode_utf8(Path(path).read_bytes(), spec), newline=""))
        try:
            names, rows, first = list(reader.fieldnames or []), list(reader), 2  # 1: the header
        except csv.Error as exc:
            raise DatasetError(csv_problem(exc, f"{spec}: line {reader.line_num + 1}")) from None
    elif path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        names, first = table.column_names, 1
        rows = table.select([f for f in fields if f in names]).to_pylist()
    else:
        raise DatasetError(f"{spec}: unknown file type (use .jsonl, .csv or .parquet)")
    if any(f not in names for f in fields):
        raise DatasetError(
            f"{spec}: line 1: needs columns {' and '.join(map(repr, fields))}, has {names}"
        )
    return [(i + first, [row[f] for f in fields]) for i, row in enumerate(rows)]


@dataclass(frozen=True)
class RtpFilter:
    """Which RealToxicityPrompts lines a run takes (`dataset.kind: realtoxicityprompts`): the
    challenging subset, `prompt.toxicity` bins, then a limit or a seeded sample (docs/cli.md).
    """

    challenging: bool = False
    toxicity_bins: tuple[tuple[float, float], ...] = ()
    limit: int | None = None
    sample_seed: int | None = None

    def keeps(self, rec: dict[str, Any], spec: str, lineno: int) -> bool:
        if self.challenging and rec.get("challenging") is not True:
            return False
        if not self.toxicity_bins:
            return True
        tox = rec["prompt"].get("toxicity")
        if tox is None:
            return False
        if isinstance(tox, bool) or not isinstance(tox, int | float):
            raise DatasetError(f"{spec}: line {lineno}: prompt.toxicity is not a number")
        return any(lo <= tox < hi or (tox == hi == 1.0) for lo, hi in self.toxicity_bins)


def load_realtoxicityprompts(
    spec: str,
    keep: RtpFilter,
    words: Any = None,
    sha256: str | None = None,
    cache_dir: str | None = None,
) -> list[Prompt]:
    """RealToxicityPrompts' JSONL (`prompt.text`, `prompt.toxicity`, `challenging`, ...), the
    lines `keep` selects. Prompt ids are `<file stem>:<line>` of the whole file, so a filter
    or a sample never renames a prompt; the group is the prompt's gender label a(c)."""
    import random

    words = words or builtin_gender_words()
    path = fetch(spec, sha256=sha256, cache_dir=cache_dir, field="dataset.path")
    stem = Path(url_basename(spec)).stem
    rows = [(ln, t) for ln, t, rec in _read_jsonl_prompts(path, spec) if keep.keeps(rec, spec, ln)]
    if not rows:
        raise DatasetError(f"{spec}: no prompt passes the dataset's filters ({keep})")
    if keep.limit is not None and keep.limit < len(rows):
        if keep.sample_seed is None:
            rows = rows[: keep.limit]
        else:
            picked = random.Random(keep.sample_seed).sample(range(len(rows)), keep.limit)
            rows = [rows[i] for i in sorted(picked)]
    return [Prompt(f"{stem}:{ln:05d}", None, label_text(t, words), t) for ln, t in rows]

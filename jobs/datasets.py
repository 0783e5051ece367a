"""Prompt datasets: paired JSONL (UDDIA format) and plain prompt lists.

Every loader validates the whole input before any work starts and names file and line in
its errors. Paths may be local files or http(s) URLs, fetched once into a local cache and
checked against a pinned SHA-256 when one is given.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import unicodedata
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.redact import redact_text

# SHA-256 of the paper's public files (UDDIA repository), pinned so a changed source is caught.
UDDIA_BASE = "https://raw.githubusercontent.com/minicheshire/Unified-Debiasing-and-Detoxifying/main"
UDDIA_FEMALE = f"{UDDIA_BASE}/prompts/175prompts-female.jsonl"
UDDIA_MALE = f"{UDDIA_BASE}/prompts/175prompts-male.jsonl"
UDDIA_GENDER_PAIRS = f"{UDDIA_BASE}/models/construct_gender_classifier/gender_pairs.txt"
PINNED_SHA256: dict[str, str] = {
    UDDIA_FEMALE: "a1337da7c9d397afaea95cbf232c43d2e43d903a09c04920335ec91072da1fc9",
    UDDIA_MALE: "cc39047d3044313bc2d2a510935b970bf7f5e0a0cb25746c8b61eb6bb676c880",
    UDDIA_GENDER_PAIRS: "9ef7e1574a9721a42f54e926e957c138dfb8fc66f948e817ad61bd1f928e4249",
}


class DatasetError(ValueError):
    """Malformed or unreadable prompt input; the message names the file and line.

    URL credentials in the message (`?token=...`) are redacted."""

    def __init__(self, message: str) -> None:
        super().__init__(redact_text(message))


def is_blank(text: str) -> bool:
    """Only whitespace, invisible format characters (zero-width space, BOM...) or controls."""
    return all(ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc", "Zs") for ch in text)


def url_basename(spec: str) -> str:
    """The file name of a path or URL, without query string or fragment."""
    return urllib.parse.urlsplit(spec).path.rsplit("/", 1)[-1] if "://" in spec else Path(spec).name


@dataclass(frozen=True)
class Prompt:
    prompt_id: str  # stable: "<group>:<line>" for paired files, "<file stem>:<line>" for lists
    pair_id: str | None
    group: str
    text: str


def default_cache_dir() -> str:
    return os.environ.get("LIDAO_CACHE", os.path.join(Path.home(), ".cache", "lidao-harness"))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(
    spec: str, sha256: str | None = None, cache_dir: str | None = None, field: str | None = None
) -> str:
    """Local path of `spec` (a path or an http(s) URL, downloaded once into the cache);
    `field` (the config field naming it, e.g. `gender_words`) starts every error message."""
    sha256 = sha256 or PINNED_SHA256.get(spec)
    named = f"{field}: {spec}" if field else spec
    if spec.startswith(("http://", "https://")):
        cache = Path(cache_dir or default_cache_dir()) / "downloads"
        cache.mkdir(parents=True, exist_ok=True)
        # The name hashes the whole URL but shows only its file name: no query token in it.
        name = hashlib.sha256(spec.encode()).hexdigest()[:16] + "-" + url_basename(spec)
        path = cache / name
        if not path.exists():
            tmp = path.with_suffix(path.suffix + ".tmp")
            try:
                with urllib.request.urlopen(spec, timeout=60) as resp, open(tmp, "wb") as out:
                    out.write(resp.read())
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                where = f"set {field} to" if field else "pass"
                raise DatasetError(
                    f"{named}: download failed ({getattr(exc, 'reason', None) or exc}); without "
                    f"network, download it elsewhere and {where} the local path, or put the "
                    f"file at {path}"
                ) from exc
            os.replace(tmp, path)
        local = str(path)
    else:
        local = os.path.expanduser(spec)
        if not os.path.isfile(local):
            raise DatasetError(f"{named}: no such file")
    if sha256 is not None:
        got = sha256_file(local)
        if got != sha256:
            if local != os.path.expanduser(spec):
                os.unlink(local)  # a bad download must not stay in the cache
            raise DatasetError(f"{named}: SHA-256 {got} does not match the pinned {sha256}")
    return local


def iter_jsonl(path: str, spec: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed record) of each non-blank line; bad JSON names `spec` and the line."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = _decode(raw, spec, lineno)
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{spec}: line {lineno}: bad JSON ({exc.msg})") from exc


def _decode(raw: bytes, spec: str, first_line: int = 1) -> str:
    """UTF-8 text of `raw`; a bad byte names `spec` and its line."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + raw[: exc.start].count(b"\n")
        raise DatasetError(
            f"{spec}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"
        ) from None


def _read_jsonl_prompts(path: str, spec: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(line number, prompt text, record) for each non-blank line."""
    out = []
    for lineno, rec in iter_jsonl(path, spec):
        prompt = rec.get("prompt") if isinstance(rec, dict) else None
        text = prompt.get("text") if isinstance(prompt, dict) else None
        if not isinstance(text, str):
            raise DatasetError(f"{spec}: line {lineno}: missing prompt.text")
        if is_blank(text):
            raise DatasetError(f"{spec}: line {lineno}: empty prompt (only blank characters)")
        out.append((lineno, text, rec))
    return out


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
    from jobs.words import builtin_gender_words, label_text

    words = words or builtin_gender_words()
    path = fetch(spec, sha256=sha256, cache_dir=cache_dir, field=field)
    stem = Path(url_basename(spec)).stem
    texts: list[tuple[int, str]] = []
    if path.endswith((".jsonl", ".json")):
        if text_field == "prompt.text":
            texts = [(ln, t) for ln, t, _ in _read_jsonl_prompts(path, spec)]
        else:
            texts = [(ln, _field(rec, text_field, spec, ln)) for ln, rec in iter_jsonl(path, spec)]
    elif path.endswith(".csv"):
        with open(path, "rb") as raw:
            data = _decode(raw.read(), spec)
        with io.StringIO(data, newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None or text_field not in reader.fieldnames:
                raise DatasetError(
                    f"{spec}: no column {text_field!r} (columns: {reader.fieldnames})"
                )
            for i, rec in enumerate(reader):
                texts.append((i + 2, rec[text_field] or ""))  # line 1 is the header
    elif path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        if text_field not in table.column_names:
            raise DatasetError(f"{spec}: no column {text_field!r} (columns: {table.column_names})")
        texts = [(i + 1, str(t or "")) for i, t in enumerate(table.column(text_field).to_pylist())]
    else:
        raise DatasetError(f"{spec}: unknown prompt file type (use .jsonl, .csv or .parquet)")
    for lineno, text in texts:
        if is_blank(text):
            raise DatasetError(f"{spec}: line {lineno}: empty prompt (only blank characters)")
    if not texts:
        raise DatasetError(f"{spec}: no prompts")
    texts = texts[:limit] if limit is not None else texts
    return [Prompt(f"{stem}:{ln:05d}", None, label_text(t, words), t) for ln, t in texts]


def _field(rec: Any, dotted: str, spec: str, lineno: int) -> str:
    cur = rec
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise DatasetError(f"{spec}: line {lineno}: missing {dotted}")
        cur = cur[part]
    if not isinstance(cur, str):
        raise DatasetError(f"{spec}: line {lineno}: {dotted} is not a string")
    return cur

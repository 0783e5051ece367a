"""Input files: local paths, or http(s) URLs fetched once into a local cache, checked against a
pinned SHA-256 when one is given; their errors (`DatasetError`) name the file and the line.

Prompt datasets (`jobs.datasets`), seed words (`jobs.words`) and head files read through here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobs.redact import redact_text

log = logging.getLogger("harness")

# SHA-256 of the paper's public files (UDDIA repository), pinned so a changed source is caught.
UDDIA_BASE = "https://raw.githubusercontent.com/minicheshire/Unified-Debiasing-and-Detoxifying/main"
UDDIA_FEMALE = f"{UDDIA_BASE}/prompts/175prompts-female.jsonl"
UDDIA_MALE = f"{UDDIA_BASE}/prompts/175prompts-male.jsonl"
UDDIA_GENDER_PAIRS = f"{UDDIA_BASE}/models/construct_gender_classifier/gender_pairs.txt"
# RealToxicityPrompts (Gehman et al., 2020), ~99k prompts: not pinned yet, as it could not be
# downloaded where this was written (docs/cli.md); `fetch` logs an unpinned download's hash.
RTP_URL = "https://huggingface.co/datasets/allenai/real-toxicity-prompts/resolve/main/prompts.jsonl"
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


def url_basename(spec: str) -> str:
    """The file name of a path or URL, without query string or fragment."""
    return urllib.parse.urlsplit(spec).path.rsplit("/", 1)[-1] if "://" in spec else Path(spec).name


def default_cache_dir() -> str:
    return os.environ.get("LIDAO_CACHE", os.path.join(Path.home(), ".cache", "lidao-harness"))


def cached_path(url: str, cache_dir: str | None = None) -> Path:
    """Where `fetch` keeps the download of `url`: the name hashes the whole URL but shows only
    its file name (no query token in it)."""
    name = hashlib.sha256(url.encode()).hexdigest()[:16] + "-" + url_basename(url)
    return Path(cache_dir or default_cache_dir()) / "downloads" / name


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
        path = cached_path(spec, cache_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
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
            if sha256 is None:  # say what to pin, once (the next read finds the cached copy)
                log.warning(
                    "%s: no pinned SHA-256; this download's is %s", named, sha256_file(path)
                )
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
            line = decode_utf8(raw, spec, lineno)
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{spec}: line {lineno}: bad JSON ({exc.msg})") from exc


def os_problem(path: Path | str, exc: OSError) -> str:
    """Why the system refuses `path` itself (not its content), in one line."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENAMETOOLONG:
        why += " (a file or folder name holds at most 255 bytes on most filesystems)"
    return f"{path}: {why}"


def csv_problem(exc: Exception, where: str) -> str:
    """`where` (FILE:LINE) and what the CSV reader refused there, in words: a field above its
    size limit is too large, not a broken file."""
    import csv

    if "field larger than field limit" in str(exc):
        return (
            f"{where}: a field is larger than {csv.field_size_limit():,} characters (the CSV "
            "reader's limit); shorten it"
        )
    return f"{where}: not a readable CSV record ({exc})"


def decode_utf8(raw: bytes, spec: str, first_line: int = 1) -> str:
    """UTF-8 text of `raw`, without the byte-order mark some editors put first (it made line 1
    of a JSONL "bad JSON", a CSV header's first column unknown); a bad byte names `spec` and
    its line."""
    if first_line == 1:
        raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + raw[: exc.start].count(b"\n")
        raise DatasetError(
            f"{spec}: line {line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
            "save the file as UTF-8"
        ) from None

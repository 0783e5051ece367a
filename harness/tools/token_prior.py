"""`python -m harness token-prior CORPUS --model M --out FILE`: unigram token counts of a corpus,
the prior UDDIA's gate weights gendered tokens by (`uddia`'s `prior:`, read by
`workers.methods.prior.load_prior`; format "lidao-token-prior/1", counts by token id). A corpus
is plain text (a document per non-blank line) or JSONL (the text under `--text-field`)."""

from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from jobs.files import sha256_file
from results.run.shards import put_bytes

PRIOR_FORMAT = "lidao-token-prior/1"


class TokenPriorError(ValueError):
    """Bad corpus or arguments; the message names the file and line."""


def add_token_prior_args(parser: argparse.ArgumentParser) -> None:
    """Declare the `token-prior` options on `parser` (torch-free)."""
    parser.add_argument("corpus", nargs="+", help="text file(s) (one document per line) or JSONL")
    parser.add_argument(
        "--model",
        required=True,
        help="LM id, local path, GGUF file (PATH.gguf or package:DIST/FILE) or tiny-random/<family>",
    )
    parser.add_argument("--revision", default=None, help="LM revision (hub models)")
    parser.add_argument("--out", required=True, help="output JSON file")
    parser.add_argument("--text-field", default="text", help="JSONL: field holding the text")
    parser.add_argument(
        "--batch-lines", type=int, default=1000, help="documents per tokenizer call"
    )


def _documents(path: Path, text_field: str) -> Iterator[str]:
    jsonl = path.suffix in (".jsonl", ".json")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if not jsonl:
                yield line.rstrip("\n")
                continue
            try:
                obj: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TokenPriorError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            for key in text_field.split("."):
                obj = obj.get(key) if isinstance(obj, dict) else None
            if not isinstance(obj, str):
                raise TokenPriorError(f"{path}:{lineno}: no text under {text_field!r}")
            yield obj


def load_tokenizer(model: str, revision: str | None = None) -> Any:
    from workers.tiny import TINY_PREFIX, tiny_tokenizer

    if model.startswith(TINY_PREFIX):
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    from workers.gguf import is_gguf_spec

    try:
        if is_gguf_spec(model):  # from the dequantised folder, as the model loads it
            from workers.models import load_tokenizer as load_lm_tokenizer

            return load_lm_tokenizer(model, revision)
        return AutoTokenizer.from_pretrained(model, revision=revision)
    except (OSError, ValueError) as exc:
        raise TokenPriorError(f"model {model!r}: cannot load its tokenizer: {exc}") from exc


def count_tokens(
    tokenizer: Any, paths: list[Path], text_field: str = "text", batch: int = 1000
) -> tuple[collections.Counter[int], int]:
    """Token id counts over every document of `paths` (no special tokens), and the documents."""
    counts: collections.Counter[int] = collections.Counter()
    docs = 0
    for path in paths:
        documents = _documents(path, text_field)
        while chunk := list(itertools.islice(documents, batch)):
            for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"]:
                counts.update(int(i) for i in ids)
            docs += len(chunk)
    return counts, docs


def write_prior(path: str, payload: dict[str, Any]) -> None:
    """`payload` as JSON at `path`, atomically (a reader never sees half a file)."""
    data = (json.dumps(payload, sort_keys=True) + "\n").encode()
    put_bytes(pafs.LocalFileSystem(), str(Path(path).absolute()), data, local=True)


def token_prior_main(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.corpus]
    for p in paths:
        if not p.is_file():
            raise TokenPriorError(f"{p}: no such corpus file")
    tokenizer = load_tokenizer(args.model, args.revision)
    counts, docs = count_tokens(tokenizer, paths, args.text_field, max(1, args.batch_lines))
    total = sum(counts.values())
    if total == 0:
        raise TokenPriorError(f"{', '.join(map(str, paths))}: the corpus has no tokens")
    payload = {
        "format": PRIOR_FORMAT,
        "model": args.model,
        "revision": args.revision,
        "vocab_size": len(tokenizer),
        "total": total,
        "documents": docs,
        "corpus": [str(p) for p in paths],
        "corpus_sha256": [sha256_file(str(p)) for p in paths],
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "counts": {str(i): c for i, c in sorted(counts.items())},
    }
    write_prior(args.out, payload)
    print(f"token-prior: {total} tokens ({len(counts)} distinct) in {docs} documents → {args.out}")
    return 0

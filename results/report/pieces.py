"""Sample generations' tokens as the report shows them: spaced as the generating model's
tokenizer decodes them (a `TokenizerFor`, `(model, revision) → Tokenizer or None`), else aligned
with the stored continuation. Nothing here downloads or imports transformers or torch.
"""

from __future__ import annotations

import os.path
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from results.report.cells import MODEL_NAMES

TokenizerFor = Callable[[str, str | None], Any]


def cached_tokenizer(model: str, revision: str | None) -> Any:
    """`model`'s `tokenizers.Tokenizer` from its directory or the Hugging Face cache, or None
    (never downloads)."""
    from tokenizers import Tokenizer

    local = Path(model) / "tokenizer.json"
    if local.is_file():
        return Tokenizer.from_file(str(local))
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(model, "tokenizer.json", revision=revision)
    return Tokenizer.from_file(path) if isinstance(path, str) else None


def decoded_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's text as the tokenizer spaces it: decode(ids[:i+1]) minus decode(ids[:i])
    (minus their common prefix, for decoders that rewrite the end of the text)."""
    pieces, before = [], ""
    for i in range(len(ids)):
        now = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        pieces.append(now[len(os.path.commonprefix([before, now])) :])
        before = now
    return pieces


def aligned_pieces(tokens: list[str], text: str) -> list[str]:
    """Without a tokenizer: each token with the characters (spaces) before it in `text`."""
    pieces, pos = [], 0
    for tok in tokens:
        at = text.find(tok, pos) if tok else -1
        if at < 0:
            pieces.append(tok)
            continue
        pieces.append(text[pos : at + len(tok)])
        pos = at + len(tok)
    return pieces


def with_pieces(
    rows: list[dict[str, Any]], tokenizer_for: TokenizerFor | None = None
) -> list[dict[str, Any]]:
    """Add `pieces` to sample rows: growing-prefix decodes with the model's tokenizer
    (`tokenizer_for`, default `cached_tokenizer`), else the tokens aligned with the
    continuation."""
    tokenizer_for = cached_tokenizer if tokenizer_for is None else tokenizer_for
    cache: dict[tuple[str, str | None], Any] = {}
    for row in rows:
        key = (str(row["model"]), row.get("model_revision"))
        if key not in cache:
            try:
                cache[key] = tokenizer_for(*key)
            except Exception:  # noqa: BLE001 - any failure falls back to aligning with the text
                cache[key] = None
        tok, ids = cache[key], row.get("token_ids")
        if tok is not None and ids:
            row["pieces"] = decoded_pieces(tok, list(ids))
        else:
            row["pieces"] = aligned_pieces(
                list(row.get("tokens") or []), str(row.get("continuation") or "")
            )
    return rows


def model_label(model: str, names: dict[str, str] | None = None) -> str:
    """A model as tables and plots print it: its entry's `name` (`names`), else the paper's
    name for the paper's LMs, else the id."""
    return (names or {}).get(model) or MODEL_NAMES.get(model, model)


def model_names(config: dict[str, Any] | None) -> dict[str, str]:
    """Model id → the `name` of its entry in a run's config (entries with a name only). The
    Parquet tables keep the id (the identity); this is a display mapping."""
    out: dict[str, str] = {}
    for entry in (config or {}).get("models") or []:
        if isinstance(entry, dict) and entry.get("name") and entry.get("id"):
            out[str(entry["id"])] = str(entry["name"])
    return out


def with_model_names(cells: pl.DataFrame, names: dict[str, str]) -> pl.DataFrame:
    """`cells` with a `model_name` column: what `layout` and the figures print per model."""
    if cells.is_empty() and "model" not in cells.columns:
        return cells
    labels = [model_label(str(m), names) for m in cells["model"].to_list()]
    return cells.with_columns(pl.Series("model_name", labels, dtype=pl.String))


def named_models(frame: pl.DataFrame, names: dict[str, str]) -> pl.DataFrame:
    """`frame` with its `model` column as tables print it (`model_label`: the entry's name)."""
    if "model" not in frame.columns or frame.is_empty():
        return frame
    labels = [model_label(str(m), names) for m in frame["model"].to_list()]
    return frame.with_columns(pl.Series("model", labels, dtype=pl.String))

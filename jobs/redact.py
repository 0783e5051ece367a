"""Secrets out of everything written or printed: secret-looking keys and URL credentials;
control characters out of what reaches a terminal (`printable`); formulas out of the CSV files
people open in a spreadsheet (`spreadsheet_safe`).

A value is secret when its key looks like one (`api_key`, `token`, `aws_secret`...), and inside
any text when it is a URL's user:password or the value of a secret-looking query parameter
(`?token=...`, `&sig=...`, `X-Amz-Signature=...`). `redact` does both to plain data (a config
snapshot read back), `redacted` to a config model (`harness.config.RunConfig`).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

SECRET_KEYS = ("key", "token", "password", "secret", "credentials")
# Query parameters that carry credentials although their names do not end in a secret key.
SECRET_QUERY = tuple(
    "sig signature auth access_token x-amz-signature x-amz-credential x-goog-signature "
    "x-goog-credential code apikey pass pwd".split()
)
REDACTED = "<redacted>"
# What a terminal acts on instead of showing: C0 and C1 controls but tab and newline, DEL, and
# the bidirectional marks and overrides (U+202E shows text backwards). From a dataset, an ESC
# sequence in a prompt would restyle or rewrite the user's terminal.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character written as `\\uXXXX` (also valid inside a JSON
    string), tab and newline kept: what a terminal may be shown."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def has_controls(text: str) -> bool:
    """Whether `printable` would change `text`."""
    return _CONTROL.search(text) is not None


_QUERY = re.compile(r"([?&;])([^=&;#\s\"']+)=([^&;#\s\"']*)")
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)([^/@\s\"']+)@")


# Words that make a key a count or a bound of something, never a secret (`max_token`,
# `num_keys`, `min_password`...).
QUANTITY_PREFIXES = ("max_", "min_", "num_", "n_")


def is_secret_key(name: str) -> bool:
    """`api_key`, `token`, `aws_secret`... (exact names or `_`/`-`-suffixes; not
    `max_new_tokens`, nor a count such as `max_token`)."""
    low = name.lower().replace("-", "_")
    if low.startswith(QUANTITY_PREFIXES):
        return False
    return any(low == s or low.endswith("_" + s) for s in SECRET_KEYS) or low in SECRET_QUERY


def redact_text(text: str) -> str:
    """`text` with URL user:password and secret query values replaced by `<redacted>`."""
    if "=" not in text and "@" not in text:
        return text

    def query(m: re.Match[str]) -> str:
        sep, key, value = m.groups()
        return f"{sep}{key}={REDACTED}" if is_secret_key(key) and value else m.group(0)

    return _QUERY.sub(query, _USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text))


def redact(obj: Any) -> Any:
    """`obj` (plain data) with secret-looking keys' values and URL credentials replaced."""
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_key(str(k)) and v else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


class Dumps(Protocol):
    """A pydantic model (e.g. `harness.config.RunConfig`): what `redacted` needs of a config."""

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


def redacted(config: Dumps) -> dict[str, Any]:
    """The config as a plain dict with every secret-looking parameter and URL token replaced."""
    return redact(config.model_dump(mode="json"))  # type: ignore[no-any-return]


# A text cell a spreadsheet may run as a formula: one starting with = + - @, a tab or a CR.
_FORMULA = r"^[=+\-@\t\r]"


def spreadsheet_safe(frame: Any) -> Any:
    """A polars frame for a CSV file people open in a spreadsheet: each text cell it would read
    as a formula (`=HYPERLINK(...)` from an annotator's name, a text starting with `-`) gets a
    leading `'`, which makes it text. Numbers stay as they are."""
    import polars as pl

    def safe(name: str) -> pl.Expr:
        col = pl.col(name)
        return pl.when(col.str.contains(_FORMULA)).then(pl.lit("'") + col).otherwise(col)

    return frame.with_columns(safe(c).alias(c) for c, t in frame.schema.items() if t == pl.String)

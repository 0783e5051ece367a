"""Demographic seed words: groups → word lists (female/male pairs by default).

Formats read:
- a pairs file, one pair per line, words in group order (`female male`), like UDDIA's
  `gender_pairs.txt`; `#` comments and blank lines are skipped;
- a JSON object `{"group": ["word", ...], ...}` for K ≥ 2 groups.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from jobs.files import DatasetError, fetch

# Written for this project: common English gendered word pairs (female, male). The paper's
# 180 pairs are UDDIA's gender_pairs.txt; point `gender_words:` at it (examples/paper-*.yaml).
BUILTIN_PAIRS: tuple[tuple[str, str], ...] = tuple(
    tuple(line.split())  # type: ignore[misc]
    for line in """
    she he|her him|hers his|herself himself|woman man|women men|girl boy|girls boys
    mother father|mothers fathers|daughter son|daughters sons|sister brother|sisters brothers
    wife husband|wives husbands|aunt uncle|aunts uncles|niece nephew|nieces nephews
    queen king|queens kings|princess prince|lady gentleman|ladies gentlemen|mom dad
    mum dad|grandmother grandfather|grandma grandpa|bride groom|girlfriend boyfriend
    female male|females males|madam sir|actress actor|actresses actors|waitress waiter
    heroine hero|duchess duke|empress emperor|nun monk|stepmother stepfather|gal guy
    She He|Her Him|Hers His|Herself Himself|Woman Man|Women Men|Girl Boy|Mother Father
    Daughter Son|Sister Brother|Wife Husband|Queen King|Lady Gentleman|Mom Dad|Madam Sir
    """.replace("\n", "|").split("|")
    if line.strip()
)


@dataclass(frozen=True)
class GroupWords:
    """Seed words of K groups; `pairs` is set when the source is a pairs file (K = 2)."""

    groups: tuple[str, ...]
    words: dict[str, tuple[str, ...]]
    pairs: tuple[tuple[str, ...], ...] = ()
    source: str = "builtin"

    def all_words(self) -> set[str]:
        return {w for ws in self.words.values() for w in ws}


def from_pairs(
    pairs: tuple[tuple[str, ...], ...], groups: tuple[str, ...], source: str
) -> GroupWords:
    words = {g: tuple(dict.fromkeys(p[i] for p in pairs)) for i, g in enumerate(groups)}
    return GroupWords(groups=groups, words=words, pairs=pairs, source=source)


def builtin_gender_words() -> GroupWords:
    return from_pairs(BUILTIN_PAIRS, ("female", "male"), "builtin")


def load_group_words(
    spec: str | None,
    groups: tuple[str, ...] = ("female", "male"),
    sha256: str | None = None,
    cache_dir: str | None = None,
    field: str | None = "gender_words",
) -> GroupWords:
    """Seed words from a path or URL (`None` = the built-in list); `field` names the config
    field in errors."""
    if spec is None or spec == "builtin":
        return builtin_gender_words()
    path = fetch(spec, sha256=sha256, cache_dir=cache_dir, field=field)
    text = Path(path).read_text(encoding="utf-8-sig")  # a BOM is no part of the first word
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{spec}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or len(obj) < 2:
            raise DatasetError(f"{spec}: expected an object of >= 2 groups → word lists")
        words = {str(g): tuple(str(w) for w in ws) for g, ws in obj.items()}
        return GroupWords(groups=tuple(words), words=words, source=spec)
    pairs = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = tuple(line.split())
        if len(parts) != len(groups):
            raise DatasetError(
                f"{spec}: line {lineno}: expected {len(groups)} words ({' '.join(groups)}), got {len(parts)}"
            )
        pairs.append(parts)
    if not pairs:
        raise DatasetError(f"{spec}: no word pairs found")
    return from_pairs(tuple(pairs), groups, spec)


def count_groups(text: str, words: GroupWords) -> dict[str, int]:
    """Whole-word, case-sensitive occurrences of each group's seed words in `text`."""
    owner: dict[str, list[str]] = {}
    for group, ws in words.words.items():
        for w in ws:
            owner.setdefault(w, []).append(group)
    counts = dict.fromkeys(words.groups, 0)
    alternation = "|".join(sorted((re.escape(w) for w in owner), key=len, reverse=True))
    for match in re.finditer(rf"(?<!\w)({alternation})(?!\w)", text):
        for group in owner[match.group(1)]:
            counts[group] += 1
    return counts


def label_text(text: str, words: GroupWords) -> str:
    """The group with the strict majority of seed-word occurrences, else `none`."""
    counts = count_groups(text, words)
    best = max(counts.values(), default=0)
    winners = [g for g, c in counts.items() if c == best]
    return winners[0] if best > 0 and len(winners) == 1 else "none"

"""The scorer interface: a plain class over generation rows, wrapped by a thin Ray actor."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jobs.catalog import check_scorer_params
from jobs.words import GroupWords, builtin_gender_words
from results.schema import METRIC_FIELDS, SCORE_KEY_FIELDS

# A row whose scoring failed for a reason that may pass (a rate limit, a 5xx, a timeout, an
# unparsable answer, out of memory): returned with this status and its error
# "<kind>: <detail>", never written, so the next `score` of the run tries it again. A
# permanent failure (a 400 for this text, a text the model cannot take) is an `error` row.
RETRY = "retry"
Row = dict[str, Any]  # a generation row in, a score row out
Batch = Callable[[list[Row]], list[Row]]  # scores a batch of rows, one out per row in


class ScorerError(ValueError):
    """A scorer that cannot start (bad parameter, label map without an expected label...)."""


@dataclass
class ScorerContext:
    """What every scorer may need besides its parameters."""

    words: GroupWords = field(default_factory=builtin_gender_words)
    cache_dir: str | None = None  # persistent caches (e.g. Perspective scores) live here
    # answers the cache in `cache_dir` lacks, from the run's storage (`CacheMirror.fill`)
    cache_fill: Callable[..., Any] | None = None
    device: str | None = None  # None: cuda if available, else cpu


class Scorer:
    """Scores generation rows; one output row per input row, never a silent drop.

    Input rows carry at least `job_id, prompt, continuation, status` (see GENERATION_SCHEMA).
    Output rows carry `results.schema.SCORE_KEY_FIELDS` + the metric's columns.
    """

    name: ClassVar[str]
    metric: ClassVar[str]
    # Ray resources of the actor; `wants_gpu` scorers get {"num_gpus": 1} when GPUs exist.
    num_cpus: ClassVar[float] = 0.5
    wants_gpu: ClassVar[bool] = False
    default_params: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every `score` a subclass defines is wrapped by `reject_non_finite`: a NaN or
        infinite score (an fp16 overflow, a broken head) becomes an error row, whatever the
        scorer (built-in or plugin) does itself."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("score")
        if own is not None and not getattr(own, "_checks_finite", False):

            @functools.wraps(own)
            def score(self: Scorer, rows: Sequence[Row]) -> list[Row]:
                return reject_non_finite(self, own(self, rows))

            score._checks_finite = True  # type: ignore[attr-defined]
            cls.score = score  # type: ignore[method-assign]

    def __init__(self, params: dict[str, Any], context: ScorerContext) -> None:
        self.check_params(params)
        self.params = {**self.default_params, **params}
        self.context = context

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> None:
        """Fail on parameter names the scorer does not know, then on values of the wrong kind or
        outside a built-in's choices and bounds (`jobs.catalog.check_scorer_params`); cheap:
        loads no model."""
        unknown = sorted(set(params) - set(cls.default_params))
        if unknown:
            raise ScorerError(
                f"scorer {cls.name!r}: unknown parameter(s) {unknown}; known: {sorted(cls.default_params) or 'none'}"
            )
        bad = check_scorer_params(cls.name, params, cls.default_params)
        if bad:
            raise ScorerError(
                f"scorer {cls.name!r}: " + "; ".join(f"{k} {v}" for k, v in bad.items())
            )

    @property
    def version(self) -> str:
        """Changes whenever the scores could change (model id + revision, API + attribute)."""
        raise NotImplementedError

    def begin(self, total: int) -> None:
        """Called once before the first `score` with the number of rows to come (progress)."""

    def score(self, rows: Sequence[Row]) -> list[Row]:
        raise NotImplementedError

    def close(self) -> dict[str, Any]:
        """Release resources; returns stats for the manifest (e.g. sent / cached / failed)."""
        return {}

    def key(self, row: Row, status: str = "ok", error: str | None = None) -> Row:
        """The key columns (`results.schema.SCORE_KEY_FIELDS`) of the score row of `row`."""
        values = (row["job_id"], self.name, self.version, self.metric, status, error)
        return {name: value for (name, _), value in zip(SCORE_KEY_FIELDS, values, strict=True)}


TEXT_JOIN = "raw"  # how prompt+continuation is joined: the raw strings, nothing inserted


def text_of(row: Row, field_name: str) -> str:
    """`continuation` or `prompt+continuation`: the text as the model saw it.

    The prompt and the continuation are concatenated exactly as generated, nothing inserted:
    a continuation that starts inside a word ("The chair" + "man said") stays inside it.
    """
    cont = str(row.get("continuation") or "")
    if field_name == "continuation":
        return cont
    if field_name == "prompt+continuation":
        return f"{row.get('prompt') or ''}{cont}"
    raise ScorerError(f"unknown text field {field_name!r}; use continuation or prompt+continuation")


def score_batched(
    scorer: Scorer, rows: Sequence[Row], batch_size: int, score_batch: Batch
) -> list[Row]:
    """Run `score_batch` over chunks of `rows`; a failing chunk is retried row by row.

    A row that still fails alone becomes a `failed_row` (`error`, or `retry` when memory ran
    out), so one bad row never drops its batch.
    """
    out: list[Row] = []
    for start in range(0, len(rows), max(1, batch_size)):
        chunk = list(rows[start : start + batch_size])
        try:
            out.extend(score_batch(chunk))
        except Exception as exc:  # noqa: BLE001 - isolated row by row, recorded in the row
            if len(chunk) > 1:
                out.extend(score_batched(scorer, chunk, 1, score_batch))
            else:
                out.append(failed_row(scorer, chunk[0], exc))
    return out


def failed_row(scorer: Scorer, row: Row, exc: Exception) -> Row:
    """The row of a text whose scoring raised `exc`: `retry` when memory ran out (CUDA's
    `OutOfMemoryError`, a `MemoryError`), else a final `error`."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        return null_row(scorer, row, RETRY, f"out of memory: {text}")
    return null_row(scorer, row, "error", text)


def score_nonempty(
    scorer: Scorer, rows: Sequence[Row], batch_size: int, score_batch: Batch
) -> list[Row]:
    """`score_batched` over the rows with a continuation, the others `status = empty`; in
    order (a `score_batch` that returned too few rows: fewer, for `check_rows` to name)."""
    blank = [not str(row.get("continuation") or "").strip() for row in rows]
    todo = [row for row, empty in zip(rows, blank) if not empty]
    scored = iter(score_batched(scorer, todo, batch_size, score_batch))
    out = [
        null_row(scorer, row, "empty") if b else next(scored, None) for row, b in zip(rows, blank)
    ]
    return [r for r in out if r is not None]


def null_row(scorer: Scorer, row: Row, status: str, error: str | None = None) -> Row:
    """A row of `scorer` for `row` with every metric column null (status empty, error, retry)."""
    rec = scorer.key(row, status=status, error=error[:2000] if error else None)
    for name, _ in METRIC_FIELDS[scorer.metric]:
        rec[name] = None
    return rec


def reject_non_finite(scorer: Scorer, rows: list[Row]) -> list[Row]:
    """Rows scored ok with a NaN or infinite metric value become `error` rows naming the field
    and the value, every metric column null: nothing downstream can mistake it for a score."""
    fields = [name for name, _ in METRIC_FIELDS.get(scorer.metric, ())]
    out = []
    for rec in rows:
        bad = [
            f"{name} = {rec[name]!r}"
            for name in fields
            if isinstance(rec.get(name), float) and not math.isfinite(rec[name])
        ]
        if rec.get("status") == "ok" and bad:
            message = (
                f"non-finite score from {scorer.name}: {', '.join(bad)} (e.g. an fp16 overflow)"
            )
            rec = null_row(scorer, rec, "error", message)
        out.append(rec)
    return out

"""Perspective API toxicity (`perspective`): batched, rate-limited, retried, cached.

Every final answer (a score, or a 400: an `error` row) is cached as it arrives
(`score_cache.ScoreCache`; docs/design.md, "Scoring"), so that a crash and a re-run ask
nothing twice and old runs can be re-scored after the service is gone; a transient failure
that outlived its retries is a `retry` row, never cached. The API key (`PERSPECTIVE_API_KEY`
or `api_key_file`) never reaches a row, error, log record or stat.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from jobs.catalog import SCORER_PARAMS
from jobs.files import default_cache_dir
from workers.scorers.base import RETRY, Scorer, ScorerContext, ScorerError, null_row, text_of
from workers.scorers.perspective_client import (
    API_VERSION,
    DEFAULT_ENDPOINT,
    MAX_TEXT_BYTES,
    NO_CALLS,
    Answer,
    Outcome,
    Pending,
    PerspectiveClient,
    SlidingWindowLimiter,
    summary_value,
)
from workers.scorers.score_cache import CachedScore, CacheKey, ScoreCache, text_sha256

MISSING = Outcome(None, "not in the Perspective cache", "missing")  # cache only: not an error
log = logging.getLogger(__name__)


def read_api_key(key_file: str | None) -> str:
    """The key from `key_file` when given, else from `PERSPECTIVE_API_KEY` (set: without
    either the scorer is cache-only)."""
    if not key_file:
        return os.environ["PERSPECTIVE_API_KEY"].strip()
    path = Path(key_file).expanduser()
    try:
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ScorerError(
            f"scorer 'perspective': cannot read api_key_file {str(path)!r}: {exc.strerror}"
        ) from None
    if not key:
        raise ScorerError(f"scorer 'perspective': api_key_file {str(path)!r} is empty")
    return key


class PerspectiveToxicity(Scorer):
    """Perspective `TOXICITY` summary score of the continuation (needs an API key).

    Parameters as in `jobs.catalog.SCORER_PARAMS`: `qps` is the project's quota, counted per
    `quota_window_s` (a minute). `cache_only` scores only what the cache holds (no key
    needed): the rest is reported missing and stays unscored, so that a later run with a key
    scores it; it is on when no key is set at all.
    """

    name = "perspective"
    metric = "toxicity"
    num_cpus = 0.25
    wants_gpu = False
    default_params: ClassVar[dict[str, Any]] = SCORER_PARAMS["perspective"]

    def __init__(self, params: dict[str, Any], context: ScorerContext) -> None:
        super().__init__(params, context)
        p = self.params
        self.attribute = str(p["attribute"]).upper()
        langs = p["languages"]
        self.languages = [langs] if isinstance(langs, str) else [str(x) for x in (langs or [])]
        endpoint = p["endpoint"] or os.environ.get("PERSPECTIVE_API_ENDPOINT") or DEFAULT_ENDPOINT
        try:
            limiter = SlidingWindowLimiter(float(p["qps"]), float(p["quota_window_s"]))
        except ValueError as exc:
            raise ScorerError(f"scorer 'perspective': qps / quota_window_s: {exc}") from None
        self.cache = ScoreCache(self._cache_path(), fill=context.cache_fill)
        self.client: PerspectiveClient | None = None
        if not self._cache_only():
            key = read_api_key(p["api_key_file"])
            self.client = PerspectiveClient(
                key, endpoint, self.attribute, self.languages, limiter, p
            )
        self.client_stats = self.client.stats if self.client else dict(NO_CALLS)
        names = ("rows", "empty", "cached", "answered", "failed", "retry", "missing")
        self.counts = dict.fromkeys(names, 0)
        self._bar: Any = None

    def _cache_only(self) -> bool:
        if self.params["cache_only"]:
            return True
        if self.params["api_key_file"] or os.environ.get("PERSPECTIVE_API_KEY", "").strip():
            return False
        log.warning(
            "perspective: no API key (PERSPECTIVE_API_KEY / api_key_file): scoring from the "
            "cache %s only; texts it lacks stay missing",
            self._cache_path(),
        )
        return True

    def _cache_path(self) -> str:
        if self.params["cache_file"]:
            return str(Path(str(self.params["cache_file"])).expanduser())
        root = self.context.cache_dir or default_cache_dir()
        return os.path.join(root, "perspective-scores.sqlite")

    @property
    def version(self) -> str:
        return f"perspective:{API_VERSION}:{self.attribute}:{','.join(self.languages)}:{self.params['text_field']}"

    def cache_key(self, text: str) -> CacheKey:
        return CacheKey(text_sha256(text), self.attribute, ",".join(self.languages), API_VERSION)

    def begin(self, total: int) -> None:
        """Open the progress bar for `total` rows to come, on a terminal without `--no-progress`
        only (in an actor or into a file the driver reports the stage; a summary at close)."""
        from workers.console import bars_enabled

        if self.params["progress"] and self._bar is None and total > 0 and bars_enabled():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                desc="perspective",
                unit="text",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
            )

    def score(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any] | None] = [None] * len(rows)
        need: dict[CacheKey, list[int]] = {}
        field = self.params["text_field"]
        for i, row in enumerate(rows):
            text = text_of(row, field)
            if not str(row.get("continuation") or "").strip():
                out[i] = null_row(self, row, "empty")
            elif len(text.encode("utf-8")) > MAX_TEXT_BYTES:
                out[i] = null_row(
                    self, row, "error", f"text is over {MAX_TEXT_BYTES} bytes; the API refuses it"
                )
            else:
                key = self.cache_key(text)
                need.setdefault(key, []).append(i)
        outcomes = {k: self._from_cache(c) for k, c in self.cache.get_many(need).items()}
        self.counts["cached"] += sum(len(need[k]) for k in outcomes)
        todo = [
            Pending(k, text_of(rows[i[0]], field)) for k, i in need.items() if k not in outcomes
        ]
        if self.client is None:  # cache-only: the rest is missing
            outcomes.update((item.key, MISSING) for item in todo)
        self._progress(len(rows) - sum(len(need[k]) for k in need if k not in outcomes))

        def settled(answers: list[tuple[CacheKey, Answer]]) -> None:
            # cached: an answer with the score, or a 400 (a property of the text)
            final: list[tuple[CacheKey, str, dict[str, Any] | None, str | None]] = []
            for key, answer in answers:
                outcomes[key] = self._outcome(answer)
                self.counts["answered"] += len(need[key])
                if outcomes[key].value is not None:
                    final.append((key, "ok", answer.response, None))
                elif answer.status == 400:
                    final.append((key, "error", None, answer.reason))
            if final:
                self.cache.put_many(final)
            self._progress(sum(len(need[key]) for key, _ in answers))

        if self.client is not None:
            self.client.fetch(todo, settled)
        for key, idx in need.items():
            for i in idx:
                out[i] = self._row(rows[i], outcomes[key])
        done = [r for r in out if r is not None]
        self.counts["rows"] += len(done)
        for status in ("empty", "error", RETRY, "missing"):
            self.counts["failed" if status == "error" else status] += sum(
                r["status"] == status for r in done
            )
        return done

    def _from_cache(self, cached: CachedScore) -> Outcome:
        if cached.status == "ok":
            return summary_value(cached.response, self.attribute)
        return Outcome(None, f"{cached.error} (cached answer of {cached.created_utc})")

    def _outcome(self, answer: Answer) -> Outcome:
        """The value, or why there is none: a transient failure (its reason starts with its
        kind) or an answer without the score is a `retry` row, a final answer an `error` row."""
        assert self.client is not None
        if answer.kind == "ok":
            outcome = summary_value(answer.response, self.attribute)
            if outcome.value is None:
                return Outcome(None, f"unparsable answer: {outcome.error}", RETRY)
            return outcome
        status = RETRY if answer.kind == "transient" else "error"
        return Outcome(None, self.client.redact(answer.reason), status)

    def _row(self, row: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
        if outcome.value is None:
            return null_row(self, row, outcome.status, outcome.error)
        return {**self.key(row), "toxicity": outcome.value}

    def _progress(self, n: int) -> None:
        if self.params["progress"] and n:
            if self._bar is None:  # begin() not called: the total grows as rows arrive
                self.begin(n)
            if self._bar is None:  # no bar here (not a terminal, or --no-progress)
                return
            if self._bar.n + n > (self._bar.total or 0):
                self._bar.total = self._bar.n + n
            self._bar.update(n)
            c = self.client_stats
            self._bar.set_postfix(
                cached=self.counts["cached"], sent=c["sent"], calls=c["calls"], refresh=False
            )

    def close(self) -> dict[str, Any]:
        """Close the bar and the cache; returns the stats and prints a one-line summary."""
        stats: dict[str, Any] = {**self.counts, **self.client_stats}
        stats["limiter_wait_s"] = round(self.client.limiter.waited_s, 3) if self.client else 0.0
        stats["backoff_s"] = round(float(stats["backoff_s"]), 3)
        stats["cache_file"] = self.cache.path
        line = (
            f"perspective: {stats['rows']} rows: {stats['cached']} cached, {stats['sent']} texts sent "
            f"({stats['calls']} calls, {stats['retries']} retries, {stats['batches']} batches), "
            f"{stats['empty']} empty, {stats['failed']} failed"
            + (f", {stats['retry']} to retry (transient failures)" if stats["retry"] else "")
            + (f", {stats['missing']} not in the cache (cache only)" if self.client is None else "")
        )
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        # Once: through the CLI's logging where it is set up (the driver, --no-ray; not under
        # -q), else on stderr (a Ray actor's log, forwarded to the driver).
        from workers.console import cli_logging

        if cli_logging():
            log.info(line)
        else:
            print(line, file=sys.stderr)
        if self.client is not None:
            self.client.close()
        self.cache.close()
        return stats

"""Perspective API toxicity (`perspective`): batched, rate-limited, retried, cached.

Every final answer is cached (`score_cache.ScoreCache`, sqlite) as it arrives, keyed by
(text hash, attribute, languages, API version) with its date and raw response: a crash and
a re-run ask nothing twice, and old runs can be re-scored after the service is gone (it is
being shut down). A 400 answer is cached too (it is a property of the text: an `error` row);
a transient failure that outlived its retries (429, 5xx, timeout, transport, an answer
without the score) is not cached and its row is a `retry` row (`base.RETRY`): not written,
so a plain `score` of the run asks again.

Empty continuations are never sent (`status = empty`), nor texts over 20 KB (`error`).

The API key comes from `PERSPECTIVE_API_KEY` or the file named by `api_key_file` and is never
written to a row, error, log record or stat: googleapiclient logs request URLs (key
included) at DEBUG, so a filter on its loggers redacts it while the scorer is open.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from workers.scorers.base import RETRY, Scorer, ScorerContext, ScorerError, null_row, text_of
from workers.scorers.perspective_client import (
    API_VERSION,
    DEFAULT_ENDPOINT,
    MAX_TEXT_BYTES,
    Answer,
    Outcome,
    Pending,
    PerspectiveClient,
    RetryPolicy,
    summary_value,
    transient_kind,
)
from workers.scorers.ratelimit import SlidingWindowLimiter
from workers.scorers.score_cache import CachedScore, CacheKey, ScoreCache, text_sha256

_LOGGERS = ("googleapiclient.discovery", "googleapiclient.http", "googleapiclient.model")

log = logging.getLogger(__name__)


def read_api_key(key_file: str | None) -> str:
    """The key from `key_file` when given, else from `PERSPECTIVE_API_KEY`."""
    if key_file:
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
    key = os.environ.get("PERSPECTIVE_API_KEY", "").strip()
    if not key:
        raise ScorerError(
            "scorer 'perspective': no API key; set PERSPECTIVE_API_KEY or the api_key_file parameter"
        )
    return key


class _Redact(logging.Filter):
    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.secret in message:
            record.msg, record.args = message.replace(self.secret, "<redacted>"), ()
        return True


class PerspectiveToxicity(Scorer):
    """Perspective `TOXICITY` summary score of the continuation (needs an API key)."""

    name = "perspective"
    metric = "toxicity"
    num_cpus = 0.25
    wants_gpu = False
    default_params: ClassVar[dict[str, Any]] = {
        "endpoint": None,  # None: PERSPECTIVE_API_ENDPOINT, else the public endpoint
        "api_key_file": None,  # None: PERSPECTIVE_API_KEY
        "attribute": "TOXICITY",
        "languages": ["en"],
        "text_field": "continuation",
        "qps": 1.0,  # the project's quota, in queries per second
        "quota_window_s": 60.0,  # the quota is counted per minute
        "batch_size": 100,
        "max_retries": 6,
        "backoff_initial_s": 20.0,
        "backoff_max_s": 300.0,
        "timeout_s": 60.0,
        "cache_file": None,  # None: <cache_dir>/perspective-scores.sqlite
        # Score only what the cache holds (no key needed); the rest is reported missing and
        # stays unscored, so a later run with a key scores it. On when no key is set at all.
        "cache_only": False,
        "progress": True,
    }

    def __init__(self, params: dict[str, Any], context: ScorerContext) -> None:
        super().__init__(params, context)
        p = self.params
        self.attribute = str(p["attribute"]).upper()
        langs = p["languages"]
        self.languages = [langs] if isinstance(langs, str) else [str(x) for x in (langs or [])]
        text_of({"prompt": "", "continuation": ""}, p["text_field"])  # fails early on a bad field
        endpoint = p["endpoint"] or os.environ.get("PERSPECTIVE_API_ENDPOINT") or DEFAULT_ENDPOINT
        try:
            limiter = SlidingWindowLimiter(float(p["qps"]), float(p["quota_window_s"]))
        except ValueError as exc:
            raise ScorerError(f"scorer 'perspective': qps / quota_window_s: {exc}") from None
        retry = RetryPolicy(
            int(p["max_retries"]), float(p["backoff_initial_s"]), float(p["backoff_max_s"])
        )
        self.cache = ScoreCache(self._cache_path())
        self.client: PerspectiveClient | None = None
        self._redact: _Redact | None = None
        if not self._cache_only():
            key = read_api_key(p["api_key_file"])
            self.client = PerspectiveClient(
                key,
                endpoint,
                self.attribute,
                self.languages,
                limiter,
                retry,
                int(p["batch_size"]),
                float(p["timeout_s"]),
            )
            self._redact = _Redact(key)
            for name in _LOGGERS:
                logging.getLogger(name).addFilter(self._redact)
        self.counts = {
            "rows": 0,
            "empty": 0,
            "cached": 0,
            "answered": 0,
            "failed": 0,
            "retry": 0,
            "missing": 0,
        }
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
        root = self.context.cache_dir or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "lidao-harness"
        )
        return os.path.join(root, "perspective-scores.sqlite")

    @property
    def version(self) -> str:
        return f"perspective:{API_VERSION}:{self.attribute}:{','.join(self.languages)}:{self.params['text_field']}"

    def cache_key(self, text: str) -> CacheKey:
        return CacheKey(text_sha256(text), self.attribute, ",".join(self.languages), API_VERSION)

    def begin(self, total: int) -> None:
        """Open the progress bar for `total` rows to come (rate and ETA)."""
        # Only on a terminal and without `--no-progress` (workers.console.bars_enabled): in
        # a Ray actor, or with output to a file or a pipe, the driver's own bar or its plain
        # lines report the stage; the summary line comes at close.
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
        texts: dict[CacheKey, str] = {}
        for i, row in enumerate(rows):
            text = text_of(row, self.params["text_field"])
            if not str(row.get("continuation") or "").strip():
                out[i] = null_row(self, row, "empty")
            elif len(text.encode("utf-8")) > MAX_TEXT_BYTES:
                out[i] = null_row(
                    self, row, "error", f"text is over {MAX_TEXT_BYTES} bytes; the API refuses it"
                )
            else:
                key = self.cache_key(text)
                need.setdefault(key, []).append(i)
                texts[key] = text
        self._progress(len(rows) - sum(len(v) for v in need.values()))
        outcomes = {k: self._from_cache(c) for k, c in self.cache.get_many(need).items()}
        self.counts["cached"] += sum(len(need[k]) for k in outcomes)
        self._progress(sum(len(need[k]) for k in outcomes))
        todo = [Pending(k, texts[k]) for k in need if k not in outcomes]
        if self.client is None:  # cache-only: the rest is missing, not an error row
            for item in todo:
                for i in need[item.key]:
                    out[i] = null_row(self, rows[i], "missing", "not in the Perspective cache")
            self.counts["missing"] += sum(len(need[it.key]) for it in todo)
            self._progress(sum(len(need[it.key]) for it in todo))
            for key, outcome in outcomes.items():
                for i in need[key]:
                    out[i] = self._row(rows[i], outcome)
            return self._finish(out)

        def settled(answers: list[tuple[CacheKey, Answer]]) -> None:
            # an answer with the score, or a 400 (a property of the text)
            final: list[tuple[CacheKey, str, dict[str, Any] | None, str | None]] = []
            for key, answer in answers:
                if (
                    answer.kind == "ok"
                    and summary_value(answer.response, self.attribute).value is not None
                ):
                    final.append((key, "ok", answer.response, None))
                elif answer.status == 400:
                    final.append((key, "error", None, answer.reason))
            if final:
                self.cache.put_many(final)
            self._progress(sum(len(need[key]) for key, _ in answers))

        assert self.client is not None
        for key, answer in self.client.fetch(todo, settled).items():
            outcomes[key] = self._outcome(answer)
            self.counts["answered"] += len(need[key])
        for key, idx in need.items():
            for i in idx:
                out[i] = self._row(rows[i], outcomes[key])
        return self._finish(out)

    def _finish(self, out: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
        done = [r for r in out if r is not None]
        self.counts["rows"] += len(done)
        self.counts["empty"] += sum(r["status"] == "empty" for r in done)
        self.counts["failed"] += sum(r["status"] == "error" for r in done)
        self.counts["retry"] += sum(r["status"] == RETRY for r in done)
        return done

    def _client_stats(self) -> dict[str, Any]:
        if self.client is None:
            return {"sent": 0, "calls": 0, "retries": 0, "batches": 0, "backoff_s": 0.0}
        return dict(self.client.stats)

    def _from_cache(self, cached: CachedScore) -> Outcome:
        if cached.status == "ok":
            return summary_value(cached.response, self.attribute)
        return Outcome(None, f"{cached.error} (cached answer of {cached.created_utc})")

    def _outcome(self, answer: Answer) -> Outcome:
        """The value, or why there is none; a transient failure's reason starts with its kind
        and ends as a `retry` row (`_row`)."""
        assert self.client is not None
        if answer.kind == "ok":
            outcome = summary_value(answer.response, self.attribute)
            return (
                outcome
                if outcome.value is not None
                else outcome._replace(error=f"unparsable answer: {outcome.error}", retry=True)
            )
        if answer.kind == "transient":
            return Outcome(
                None, f"{transient_kind(answer)}: {self.client.redact(answer.reason)}", True
            )
        return Outcome(None, self.client.redact(answer.reason))

    def _row(self, row: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
        if outcome.value is None:
            return null_row(self, row, RETRY if outcome.retry else "error", outcome.error)
        rec = self.key(row)
        rec["toxicity"] = outcome.value
        return rec

    def _progress(self, n: int) -> None:
        if self.params["progress"] and n:
            if self._bar is None:  # begin() not called: the total grows as rows arrive
                self.begin(n)
            if self._bar is None:  # no bar here (not a terminal, or --no-progress)
                return
            if self._bar.n + n > (self._bar.total or 0):
                self._bar.total = self._bar.n + n
            self._bar.update(n)
            c = self._client_stats()
            self._bar.set_postfix(
                cached=self.counts["cached"], sent=c["sent"], calls=c["calls"], refresh=False
            )

    def close(self) -> dict[str, Any]:
        """Close the bar and the cache; returns the stats and prints a one-line summary."""
        stats: dict[str, Any] = {**self.counts, **self._client_stats()}
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
        if self._redact is not None:
            for name in _LOGGERS:
                logging.getLogger(name).removeFilter(self._redact)
        self.cache.close()
        return stats

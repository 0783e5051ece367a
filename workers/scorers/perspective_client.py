"""The Perspective API transport: batched analyze calls under the quota (a sliding-window
limiter), per-item retries (docs/design.md, "Scoring"; the service is built from
`perspective_discovery.json`, batches with their own `batch_uri`).

googleapiclient never retries parts of a batch and its own backoff is far too short for a
per-minute quota: each item is retried here on 429 / 5xx / connection errors, with a backoff
of tens of seconds, capped. Error texts are built from status and reason, never from
`str(HttpError)`, which holds the request URL and with it the API key.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from workers.scorers.base import ScorerError
from workers.scorers.score_cache import CacheKey

log = logging.getLogger(__name__)
LOG_WAIT_S = 5.0  # backoffs at least this long are logged with what they wait for

API_VERSION = "v1alpha1"
DEFAULT_ENDPOINT = "https://commentanalyzer.googleapis.com/"
DISCOVERY = Path(__file__).with_name("perspective_discovery.json")
MAX_TEXT_BYTES = 20480  # the API answers 400 above this; not worth a call
MAX_BATCH = 100
NO_ANSWER = "no answer in the batch response"
NO_CALLS = {"sent": 0, "calls": 0, "retries": 0, "batches": 0, "backoff_s": 0.0}  # client stats
LOGGERS = ("googleapiclient.discovery", "googleapiclient.http", "googleapiclient.model")


class Answer(NamedTuple):
    """What one call came back with."""

    kind: str  # ok | final | transient (retried, or given up) | fatal
    response: dict[str, Any] | None = None
    reason: str = ""
    status: int | None = None  # HTTP status, None for connection errors


class Outcome(NamedTuple):
    value: float | None
    error: str | None
    status: str = "error"  # of the row when there is no value: error | retry | missing


@dataclass
class Pending:
    key: CacheKey
    text: str
    attempts: int = 0
    not_before: float = 0.0


def summary_value(response: dict[str, Any] | None, attribute: str) -> Outcome:
    """The summary score of `attribute` in an analyze response, or why there is none."""
    try:
        return Outcome(float(response["attributeScores"][attribute]["summaryScore"]["value"]), None)  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return Outcome(None, f"answer has no summaryScore for {attribute}")


def transient_kind(answer: Answer) -> str:
    """What a transient failure was, in the words of the "N rows failed: ..." line: rate
    limited, server error, timed out, unparsable answer or transport error."""
    reason = answer.reason
    if answer.status == 429:
        return "rate limited"
    if answer.status == 408 or "Timeout" in reason or "timed out" in reason:
        return "timed out"
    if answer.status is not None and answer.status >= 500:
        return "server error"
    if reason.startswith(("BatchError", "ValueError", "KeyError", "JSONDecodeError", NO_ANSWER)):
        return "unparsable answer"
    return "transport error"


def http_reason(status: int, content: bytes | str) -> str:
    """`HTTP 400 INVALID_ARGUMENT: message [REASON]` from a Google JSON error body."""
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else str(content)
    try:
        err = json.loads(text)["error"]
        details = [d.get("reason") or d.get("errorType") for d in err.get("details") or []]
        tags = " ".join(f"[{t}]" for t in details if t)
        head = f"HTTP {status} {err.get('status') or ''}".strip() + ":"
        return " ".join(x for x in (head, str(err.get("message") or ""), tags) if x)
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"HTTP {status}: {text[:200]}"


class SlidingWindowLimiter:
    """At most `limit` = floor(`rate` * `window_s`) calls in any `window_s`-second window (60
    for a per-minute quota), counting batched calls one by one; `clock` / `sleep` for tests.

    Each call is recorded when its request *finished* (the server saw it at some moment
    before), so the next call, which waits until the oldest recorded call has left the window,
    reaches the server at least one full window after it: the server can never count more
    than the limit, however long the requests take. Failed calls (429, 5xx) count too.
    """

    def __init__(
        self,
        rate: float,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or window_s <= 0:
            raise ValueError(f"rate ({rate}) and window_s ({window_s}) must be > 0")
        self.limit = math.floor(rate * window_s + 1e-9)
        if self.limit < 1:
            raise ValueError(f"rate {rate}/s over {window_s}s allows no call at all")
        self.window_s = window_s
        self._clock, self._sleep = clock, sleep
        self._done: deque[float] = deque()  # finish times of recorded calls, oldest first
        self._lock = threading.Lock()  # one batch in flight at a time
        self.waited_s = 0.0

    def wait_for(self, n: int) -> None:
        """Block until `n` more calls fit in the window that starts now."""
        if n > self.limit:
            raise ValueError(
                f"{n} calls at once exceed the quota of {self.limit} per {self.window_s}s"
            )
        while True:
            now = self._clock()
            while self._done and self._done[0] <= now - self.window_s:
                self._done.popleft()
            if len(self._done) + n <= self.limit:
                return
            # The oldest calls that must leave before n more fit.
            leave = self._done[len(self._done) + n - self.limit - 1] + self.window_s
            delay = max(leave - now, 1e-3)
            self.waited_s += delay
            self._sleep(delay)

    @contextmanager
    def calls(self, n: int) -> Iterator[None]:
        """Wait for room for `n` calls, run the body (the request), record them when it ends."""
        with self._lock:
            self.wait_for(n)
            try:
                yield
            finally:
                self._done.extend([self._clock()] * n)


class PerspectiveClient:
    """Sends analyze calls in batches under the quota, retrying transient answers per item
    (the i-th retry after min(`backoff_max_s`, `backoff_initial_s` * 2**(i - 1)) seconds).

    `params` are the scorer's (`batch_size`, `timeout_s`, `max_retries`, `backoff_*`). While
    it is open (until `close`) the key is redacted from googleapiclient's log records: it logs
    request URLs, key included, at DEBUG.
    """

    def __init__(
        self,
        api_key: str,
        endpoint: str,
        attribute: str,
        languages: list[str],
        limiter: SlidingWindowLimiter,
        params: dict[str, Any],
    ) -> None:
        import httplib2
        from googleapiclient.discovery import build_from_document

        self._secret = api_key
        self._http = httplib2.Http(timeout=float(params["timeout_s"]))
        self._service = build_from_document(
            DISCOVERY.read_text(encoding="utf-8"),
            developerKey=api_key,
            http=self._http,
            client_options={"api_endpoint": endpoint},
        )
        self.batch_uri = endpoint.rstrip("/") + "/batch"
        self.attribute = attribute
        # an analyze request's body but for its "comment"
        self.request: dict[str, Any] = dict(
            requestedAttributes={attribute: {}}, languages=languages, doNotStore=True
        )
        self.limiter, self.max_retries = limiter, int(params["max_retries"])
        self.backoff = (float(params["backoff_initial_s"]), float(params["backoff_max_s"]))
        self.batch_size = max(1, min(int(params["batch_size"]), MAX_BATCH, limiter.limit))
        self.pause_until = 0.0  # after a 429 nobody sends until then: the quota is spent
        self.last_reason: str | None = None
        self.stats = dict(NO_CALLS)
        for name in LOGGERS:
            logging.getLogger(name).addFilter(self._redact_record)

    def redact(self, text: str) -> str:
        return text.replace(self._secret, "<redacted>")

    def _redact_record(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self._secret in message:
            record.msg, record.args = self.redact(message), ()
        return True

    def close(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeFilter(self._redact_record)

    def _refused(self, exc: Any) -> Answer:
        """Sort an `HttpError`: retry it, record it, or stop everything.

        A bad key comes back as 400 `API_KEY_INVALID`, not 401: it must stop the run, not be
        cached as a final answer for every text.
        """
        status = int(exc.resp.status)
        reason = self.redact(http_reason(status, exc.content))
        if status in (408, 429) or status >= 500:
            return Answer("transient", reason=reason, status=status)
        fatal = status in (401, 403) or "API_KEY" in reason or "API key" in reason
        return Answer("fatal" if fatal else "final", reason=reason, status=status)

    def fetch(
        self, items: list[Pending], settled: Callable[[list[tuple[CacheKey, Answer]]], None]
    ) -> None:
        """Send `items` until each is settled: ok, final (e.g. a 400 for this text), or
        transient when its retries ran out (the row is left for a later `score`). Each batch
        request's settled items go to `settled([(key, answer)...])` (a cache transaction a
        batch; progress).

        Raises:
            ScorerError: an answer says the key or project is refused (401/403).
        """
        pending = {it.key: it for it in items}
        while pending:
            batch = self._ready(pending)
            answers = self._send(batch)
            now = time.monotonic()
            done = []
            for i, item in enumerate(batch):
                answer = answers.get(str(i)) or Answer("transient", reason=NO_ANSWER)
                final = self._settle(item, answer, now)
                if final is not None:
                    done.append((pending.pop(item.key).key, final))
            if done:
                settled(done)

    def _ready(self, pending: dict[CacheKey, Pending]) -> list[Pending]:
        """The next batch: items whose backoff has passed, waiting for the first one if none."""
        while True:
            now = time.monotonic()
            if self.pause_until <= now:
                ready = [it for it in pending.values() if it.not_before <= now]
                if ready:
                    return ready[: self.batch_size]
            wake = max(self.pause_until, min(it.not_before for it in pending.values()))
            if wake - now >= LOG_WAIT_S:  # never back off silently for minutes
                log.warning(
                    "perspective: waiting %.0fs before retrying %d text(s) at %s (last answer: %s)",
                    wake - now,
                    len(pending),
                    self.batch_uri,
                    self.last_reason or "-",
                )
            self.stats["backoff_s"] += max(0.0, wake - now)
            time.sleep(max(1e-3, wake - now))

    def _settle(self, item: Pending, answer: Answer, now: float) -> Answer | None:
        """The item's final answer, or None when it is to be retried later."""
        if answer.kind == "fatal":
            raise ScorerError(
                f"scorer 'perspective': the API refused the request ({self.redact(answer.reason)}); "
                "check the API key and that the Perspective API is enabled for its project"
            )
        if answer.kind != "transient":
            return answer
        item.attempts += 1
        self.last_reason = self.redact(answer.reason)
        if item.attempts > self.max_retries:  # given up for now, not a final answer
            reason = f"no answer after {item.attempts} attempts; last: {answer.reason}"
            reason = f"{transient_kind(answer)}: {reason}"
            return answer._replace(reason=self.redact(reason))
        delay = min(self.backoff[1], self.backoff[0] * 2 ** (item.attempts - 1))
        item.not_before = now + delay
        if answer.status == 429:
            self.pause_until = max(self.pause_until, now + delay)
        return None

    def _send(self, batch: list[Pending]) -> dict[str, Answer]:
        """One batch request; answers by request id (str index). Missing ids: no answer."""
        from googleapiclient.errors import HttpError
        from googleapiclient.http import BatchHttpRequest

        answers: dict[str, Answer] = {}

        def on_answer(request_id: str, response: Any, exc: Exception | None) -> None:
            if exc is None:
                answers[request_id] = Answer("ok", response=response, status=200)
            elif isinstance(exc, HttpError):
                answers[request_id] = self._refused(exc)
            else:
                answers[request_id] = Answer("transient", reason=self.redact(type(exc).__name__))

        request = BatchHttpRequest(callback=on_answer, batch_uri=self.batch_uri)
        for i, item in enumerate(batch):
            body = {"comment": {"text": item.text}, **self.request}
            request.add(self._service.comments().analyze(body=body), request_id=str(i))
        self.stats["sent"] += sum(1 for it in batch if it.attempts == 0)  # distinct texts
        self.stats["calls"] += len(batch)
        self.stats["retries"] += sum(1 for it in batch if it.attempts > 0)
        self.stats["batches"] += 1
        with self.limiter.calls(len(batch)):
            failed = self._execute(request)
        if failed is not None:  # the batch as a whole failed: every unanswered item shares it
            answers.update({str(i): failed for i in range(len(batch)) if str(i) not in answers})
        return answers

    def _execute(self, request: Any) -> Answer | None:
        """Run a batch request; None when it went through (answers arrived by callback)."""
        import httplib2
        from googleapiclient.errors import BatchError, HttpError

        # refused, reset, timed out (OSError...); a part that is not JSON (ValueError) or missing
        transport = (
            OSError,
            httplib2.HttpLib2Error,
            http.client.HTTPException,
            ValueError,
            KeyError,
        )
        try:
            request.execute(http=self._http)
        except BatchError as exc:  # an HttpError too: a body that is not multipart (garbage)
            return Answer("transient", reason=self.redact(f"BatchError: {exc}"[:300]))
        except HttpError as exc:  # the batch request itself was refused (429, 5xx...)
            answer = self._refused(exc)
            if answer.kind == "final":  # a 4xx of the whole batch says nothing about any text
                return answer._replace(kind="fatal", reason=f"batch request: {answer.reason}")
            return answer
        except transport as exc:
            return Answer("transient", reason=self.redact(f"{type(exc).__name__}: {exc}"[:300]))
        return None

"""A local stand-in for the Perspective API, for tests: real HTTP on 127.0.0.1, real formats.

It speaks `POST /v1alpha1/comments:analyze?key=...` (JSON) and `POST /batch` (multipart/mixed
of `application/http` parts, answered in the same format, with `Content-ID: <response-...>`),
checks the key, and records every call with its arrival time. Faults are injected by setting
attributes under `lock`: a burst of 429s, per-text status scripts (500, 503...), final 400s,
whole-batch failures, dropped connections, garbage bodies, delays, and a hold that freezes
answers after N.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

ANALYZE_PATH = "/v1alpha1/comments:analyze"

REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests"}
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def default_score(text: str) -> float:
    """A deterministic toxicity in [0, 1) from the text, so tests can check values."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8


def response(text: str, attrs: list[str], value: float) -> dict[str, Any]:
    """An analyze answer shaped as the service's: a summary and one span score per attribute."""
    score = {"value": value, "type": "PROBABILITY"}
    span = {"begin": 0, "end": len(text), "score": score}
    scores = {a: {"spanScores": [span], "summaryScore": score} for a in attrs}
    return {"attributeScores": scores, "languages": ["en"], "detectedLanguages": ["en"]}


def error_body(status: int, message: str, reason: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {
        "code": status,
        "message": message,
        "status": STATUS_NAMES.get(status, ""),
    }
    if reason:
        err["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason}]
    return {"error": err}


@dataclass
class Call:
    t: float  # time.monotonic() at arrival
    text: str
    key: str
    status: int


@dataclass
class FakePerspective:
    """The server's behaviour (edit under `lock`) and its records."""

    api_key: str = "test-key"
    score: Callable[[str], float] = default_score
    burst_429: int = 0  # the next N calls get 429
    scripts: dict[str, list[int]] = field(default_factory=dict)  # text → statuses of next attempts
    final_400: set[str] = field(default_factory=set)  # texts answered 400 every time
    batch_status: list[int] = field(default_factory=list)  # next batch requests fail whole
    drop_batches: int = 0  # the next N batch requests: connection closed, no answer
    garbage_batches: int = 0  # the next N batch requests: a 200 whose body is not multipart
    delay_s: float = 0.0  # before each answer
    hold_after: int | None = None  # after N answered 200s, hang every request until released
    calls: list[Call] = field(default_factory=list)
    answered: Counter[str] = field(default_factory=Counter)  # 200 answers per text
    batches: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)

    # ---- one analyze call ------------------------------------------------------------------
    def analyze(self, query: str, body: bytes) -> tuple[int, dict[str, Any]]:
        key = parse_qs(query).get("key", [""])[0]
        req = json.loads(body or b"{}")
        text = str(req.get("comment", {}).get("text", ""))
        attrs = list(req.get("requestedAttributes") or {})
        with self.lock:
            status, answer = self._answer(key, text, attrs)
            self.calls.append(Call(time.monotonic(), text, key, status))
            if status == 200:
                self.answered[text] += 1
        return status, answer

    def _answer(self, key: str, text: str, attrs: list[str]) -> tuple[int, dict[str, Any]]:
        if key != self.api_key:
            return 400, error_body(
                400, "API key not valid. Please pass a valid API key.", "API_KEY_INVALID"
            )
        if self.burst_429 > 0:
            self.burst_429 -= 1
            return 429, error_body(429, "Quota exceeded for quota metric 'Analysis requests'.")
        script = self.scripts.get(text)
        if script:
            status = script.pop(0)
            return status, error_body(status, f"injected {status}")
        if not text or text in self.final_400:
            return 400, error_body(400, "Attribute TOXICITY does not support request languages: xx")
        return 200, response(text, attrs, float(self.score(text)))

    def held(self) -> bool:
        with self.lock:
            return self.hold_after is not None and sum(self.answered.values()) >= self.hold_after

    # ---- the HTTP server -------------------------------------------------------------------
    def __enter__(self) -> FakePerspective:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def arrival_times(self) -> list[float]:
        with self.lock:
            return sorted(c.t for c in self.calls)


def _split_part(payload: str) -> tuple[str, str, bytes]:
    """An `application/http` part → (method, target, body)."""
    head, _, body = payload.replace("\r\n", "\n").partition("\n\n")
    method, target, _ = head.split("\n", 1)[0].split(" ", 2)
    return method, target, body.encode()


def _batch_response(parts: list[tuple[str, int, dict[str, Any]]]) -> tuple[str, bytes]:
    boundary = f"batch_{uuid.uuid4().hex}"
    chunks = []
    for content_id, status, answer in parts:
        inner = content_id.strip("<>")
        chunks.append(
            f"--{boundary}\r\nContent-Type: application/http\r\n"
            f"Content-ID: <response-{inner}>\r\n\r\n"
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps(answer)}\r\n"
        )
    body = "".join(chunks) + f"--{boundary}--\r\n"
    return f"multipart/mixed; boundary={boundary}", body.encode()


def _handler(fake: FakePerspective) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status, REASONS.get(status))
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client timed out: gone
                self.close_connection = True

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if fake.held():
                fake.release.wait(30)
                self.close_connection = True
                return
            if fake.delay_s:
                time.sleep(fake.delay_s)
            url = urlsplit(self.path)
            if url.path == ANALYZE_PATH:
                status, answer = fake.analyze(url.query, body)
                self._send(status, "application/json", json.dumps(answer).encode())
            elif url.path == "/batch":
                self._batch(body)
            else:
                self._send(
                    404, "application/json", json.dumps(error_body(404, "no such path")).encode()
                )

        def _batch(self, body: bytes) -> None:
            with fake.lock:
                fake.batches += 1
                whole = fake.batch_status.pop(0) if fake.batch_status else None
                drop = fake.drop_batches > 0
                fake.drop_batches -= int(drop)
                garbage = fake.garbage_batches > 0
                fake.garbage_batches -= int(garbage)
            if drop:
                self.close_connection = True  # no answer at all: a connection error
                return
            if garbage:
                return self._send(200, "text/html", b"<html>upstream proxy says hello</html>")
            if whole is not None:
                payload = json.dumps(error_body(whole, f"injected batch {whole}")).encode()
                return self._send(whole, "application/json", payload)
            header = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
            message = BytesParser().parsebytes(header + body)
            parts = []
            for part in message.get_payload():
                assert isinstance(part, Message)
                _, target, inner = _split_part(str(part.get_payload()))
                status, answer = fake.analyze(urlsplit(target).query, inner)
                parts.append((part["Content-ID"], status, answer))
            ctype, out = _batch_response(parts)
            self._send(200, ctype, out)

    return Handler

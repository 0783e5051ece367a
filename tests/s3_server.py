"""A moto S3 server on 127.0.0.1 that counts the requests it answers and can fail some of them.

Used by the storage tests (fault injection) and by `benchmarks/bench_scale.py` (request counts).
pyarrow's S3 client is C++: Python-level mocks do not see it, a server does.

* `server.requests`: a `Counter` of "METHOD kind" (kind: `list`, `head`, `get`, `put`,
  `multipart-create`, `multipart-part`, `multipart-complete`, `multipart-abort`, `copy`,
  `delete`, `other`), also served as JSON at `GET /__requests` (for another process).
* `server.uploaded`: a `Counter` of bytes sent to the server by path (PUT and POST bodies:
  objects, parts of multipart uploads, and the small bodies of other requests).
* `server.fail(match, times, status)`: the next `times` requests whose "METHOD path" contains
  `match` are answered with `status` (an S3 error body) instead of reaching moto.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

from tests.aws_env import AWS_ENV

COUNTS_PATH = "/__requests"


def request_kind(method: str, query: str, headers: dict[str, str]) -> str:
    """What one S3 request does, from its method, query string and headers."""
    q = query.split("&")
    has = {part.split("=", 1)[0] for part in q if part}
    if method == "GET":
        return "list" if ("list-type" in has or "prefix" in has or "delimiter" in has) else "get"
    if method == "HEAD":
        return "head"
    if method == "POST":
        if "uploads" in has:
            return "multipart-create"
        if "uploadId" in has:
            return "multipart-complete"
        if "delete" in has:
            return "delete"
        return "other"
    if method == "PUT":
        if "uploadId" in has:
            return "multipart-part"
        if "x-amz-copy-source" in headers:
            return "copy"
        return "put"
    if method == "DELETE":
        return "multipart-abort" if "uploadId" in has else "delete"
    return "other"


class CountingMotoServer(ThreadedMotoServer):
    """`ThreadedMotoServer` with a request counter and scripted failures (module docstring)."""

    def __init__(self, port: int = 0) -> None:
        super().__init__(ip_address="127.0.0.1", port=port, verbose=False)
        self.requests: Counter[str] = Counter()
        self.uploaded: Counter[str] = Counter()
        self._faults: list[list[Any]] = []  # [match, times left, status]
        self._lock = threading.Lock()

    def fail(self, match: str, times: int, status: int = 500) -> None:
        with self._lock:
            self._faults.append([match, times, status])

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.uploaded.clear()
            self._faults.clear()

    def total(self, kinds: Iterable[str] | None = None) -> int:
        wanted = set(kinds) if kinds is not None else None
        return sum(v for k, v in self.requests.items() if wanted is None or k.split()[1] in wanted)

    def _fault(self, what: str) -> int | None:
        with self._lock:
            for fault in self._faults:
                if fault[1] > 0 and fault[0] in what:
                    fault[1] -= 1
                    return int(fault[2])
        return None

    def _middleware(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            path, method = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"]
            if path == COUNTS_PATH:
                with self._lock:
                    body = json.dumps(dict(self.requests)).encode()
                start_response("200 OK", [("Content-Type", "application/json")])
                return [body]
            headers = {
                k[5:].lower().replace("_", "-"): str(v)
                for k, v in environ.items()
                if k.startswith("HTTP_")
            }
            kind = request_kind(method, environ.get("QUERY_STRING", ""), headers)
            size = headers.get("x-amz-decoded-content-length") or environ.get("CONTENT_LENGTH")
            with self._lock:
                self.requests[f"{method} {kind}"] += 1
                if method in ("PUT", "POST"):
                    self.uploaded[path] += int(size or 0)
            status = self._fault(f"{method} {path}")
            if status is not None:
                body = (
                    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                    b"<Message>injected fault</Message></Error>"
                )
                start_response(f"{status} Injected", [("Content-Type", "application/xml")])
                return [body]
            return app(environ, start_response)

        return wrapped

    def _server_entry(self) -> None:  # as moto's, with the middleware around its app
        from moto.server import MotoRequestHandler  # type: ignore[attr-defined]

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request

        app = self._middleware(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()

    def uri(self, bucket: str, key: str) -> str:
        host, port = self.get_host_and_port()
        return f"s3://{bucket}/{key}?endpoint_override={host}:{port}&scheme=http"

    def create_bucket(self, bucket: str) -> None:
        import boto3

        host, port = self.get_host_and_port()
        boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            aws_access_key_id=AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=AWS_ENV["AWS_DEFAULT_REGION"],
        ).create_bucket(Bucket=bucket)


def remote_counts(uri: str) -> Counter[str]:
    """The request counts of the server an `s3://...?endpoint_override=HOST:PORT` URI names."""
    import urllib.request

    endpoint = uri.split("endpoint_override=", 1)[1].split("&", 1)[0]
    with urllib.request.urlopen(f"http://{endpoint}{COUNTS_PATH}", timeout=10) as resp:
        return Counter(json.loads(resp.read().decode()))

"""The credentials of the local S3 stand-in (moto on 127.0.0.1) and `aws_test_env`, which sets
them in this process's environment for a block (module-scoped fixtures have no `monkeypatch`).
No pytest here: `benchmarks/bench_scale.py` reaches it through tests/s3_server.py."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def aws_test_env() -> Iterator[None]:
    """`AWS_ENV` set for the block; each variable as it was (or unset) after."""
    saved = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

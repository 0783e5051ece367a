"""A client-side limiter that keeps calls under a quota over every sliding window.

A quota of `rate` calls per second, enforced by the server per `window_s` (Perspective: per
minute), allows `floor(rate * window_s)` calls in any window of that length. Each call is
recorded when its request *finished* (the server saw it at some moment before that), so the
next call, which waits until the oldest recorded call has left the window, reaches the server
at least one full window after it: the server can never count more than the limit, however
long the requests take. Calls that failed (429, 5xx) are recorded too: they count against
the quota all the same.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class SlidingWindowLimiter:
    """At most `limit` = floor(`rate` * `window_s`) calls in any `window_s`-second window (60
    for a per-minute quota), counting batched calls one by one; `clock` / `sleep` for tests."""

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

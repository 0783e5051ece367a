"""Progress bars per stage (jobs done / planned, rate, ETA) that also read well in `ray job logs`."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, stage: str, total: int, done: int = 0, enabled: bool = True) -> None:
        tty = sys.stderr.isatty()
        self.failed = 0
        self.bar = tqdm(
            total=total,
            initial=done,
            desc=stage,
            unit="job",
            disable=not enabled,
            mininterval=0.5 if tty else 10.0,
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def update(self, n: int, ok: int | None = None) -> None:
        if ok is not None:
            self.failed += n - ok
            if self.failed:
                self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()

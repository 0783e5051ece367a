"""A fake device memory for the batch sizer's tests (`workers.generator.BatchSizer`)."""

from __future__ import annotations

import torch


class FakeMemory:
    """A device of `capacity` bytes where a batch takes `per_token` bytes per sequence-token."""

    def __init__(self, capacity: int, per_token: int, in_use: int = 1000) -> None:
        self.capacity_, self.per_token, self.in_use = capacity, per_token, in_use
        self.peak_ = in_use

    def start(self) -> int:
        self.peak_ = self.in_use
        return self.in_use

    def peak(self) -> int:
        return self.peak_

    def capacity(self) -> int:
        return self.capacity_

    def run(self, sequences: int, length: int) -> None:
        need = self.in_use + sequences * length * self.per_token
        if need > self.capacity_:
            raise torch.cuda.OutOfMemoryError("fake: out of memory")
        self.peak_ = max(self.peak_, need)

"""`DoneIds`: the ids of finished jobs, held compactly for resume checks.

A Python set of a million job ids costs ~100 MB of driver memory; this holds them as one sorted
NumPy array of fixed-width bytes (23 bytes an id for `j1-` ids: 23 MB for a million) built from
the Arrow column without creating a Python string per id, and answers membership for a chunk of
ids with one `searchsorted`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class DoneIds:
    """A sorted, duplicate-free array of job ids (bytes of equal width)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = ids  # sorted unique, dtype S<width>

    @classmethod
    def from_arrow(cls, column: pa.ChunkedArray | pa.Array) -> DoneIds:
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        arr = arr.drop_null()
        if len(arr) == 0:
            return cls(np.array([], dtype="S1"))
        lengths = pc.binary_length(arr)
        low, high = pc.min(lengths).as_py(), pc.max(lengths).as_py()
        if low == high and arr.type == pa.string() and arr.offset == 0:
            # equal widths: the data buffer *is* a fixed-width array, no Python objects needed
            offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1)
            data = arr.buffers()[2]
            raw = np.frombuffer(data, dtype=f"S{high}", count=len(arr), offset=int(offsets[0]))
        else:
            raw = np.array(arr.to_pylist(), dtype=f"S{max(high, 1)}")
        return cls(np.unique(raw))

    @classmethod
    def from_ids(cls, ids: Sequence[str]) -> DoneIds:
        return cls.from_arrow(pa.array(list(ids), pa.string()))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes)

    def contains(self, ids: Sequence[str]) -> np.ndarray:
        """Boolean mask: which of `ids` are done."""
        if not len(self.ids) or not len(ids):
            return np.zeros(len(ids), dtype=bool)
        width = self.ids.dtype.itemsize
        probe = np.array([s.encode() for s in ids], dtype=object)
        fits = np.fromiter((len(b) <= width for b in probe), dtype=bool, count=len(probe))
        keys = probe.astype(f"S{width}")  # longer ids are truncated here, then masked out
        pos = np.searchsorted(self.ids, keys).clip(0, len(self.ids) - 1)
        return (self.ids[pos] == keys) & fits

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and bool(self.contains([job_id])[0])

    def to_list(self) -> list[str]:
        return [b.decode() for b in self.ids.tolist()]

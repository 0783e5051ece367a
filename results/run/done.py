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
        raw = _fixed_width(arr)
        if raw is None:
            high = pc.max(pc.binary_length(arr)).as_py()
            raw = np.array(arr.to_pylist(), dtype=f"S{max(high, 1)}")
        return cls(np.unique(raw))

    @classmethod
    def from_arrays(cls, arrays: Sequence[pa.Array]) -> DoneIds:
        """From several Arrow string arrays (a streamed scan), without one big Arrow column."""
        parts = []
        for arr in arrays:
            arr = arr.drop_null()
            if len(arr):
                raw = _fixed_width(arr)
                if raw is None:
                    high = pc.max(pc.binary_length(arr)).as_py()
                    raw = np.array(arr.to_pylist(), dtype=f"S{max(high, 1)}")
                parts.append(raw)
        return cls.merge(parts)

    @classmethod
    def merge(cls, parts: list[np.ndarray]) -> DoneIds:
        """From NumPy `S<width>` arrays (widths may differ); `parts` is emptied on the way."""
        parts[:] = [p for p in parts if len(p)]
        if not parts:
            return cls(np.array([], dtype="S1"))
        width = max(p.dtype.itemsize for p in parts)
        ids = np.concatenate([p.astype(f"S{width}", copy=False) for p in parts])
        parts.clear()
        ids.sort()  # in place: np.unique would sort a second copy
        keep = np.empty(len(ids), dtype=bool)
        keep[0] = True
        np.not_equal(ids[1:], ids[:-1], out=keep[1:])
        return cls(ids if keep.all() else ids[keep])

    def minus(self, other: DoneIds) -> DoneIds:
        """The ids of `self` that are not in `other`."""
        if not len(self.ids) or not len(other.ids):
            return self
        return DoneIds(self.ids[~other.contains_bytes(self.ids)])

    def contains_bytes(self, keys: np.ndarray) -> np.ndarray:
        width = self.ids.dtype.itemsize
        fits = np.char.str_len(keys) <= width
        keys = keys.astype(f"S{width}")
        pos = np.searchsorted(self.ids, keys).clip(0, len(self.ids) - 1)
        return np.asarray((self.ids[pos] == keys) & fits)

    @classmethod
    def from_ids(cls, ids: Sequence[str]) -> DoneIds:
        return cls.from_arrow(pa.array(list(ids), pa.string()))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes)

    def contains(self, ids: Sequence[str] | pa.Array) -> np.ndarray:
        """Boolean mask: which of `ids` (strings, or an Arrow string array) are done."""
        if not len(self.ids) or not len(ids):
            return np.zeros(len(ids), dtype=bool)
        width = self.ids.dtype.itemsize
        if isinstance(ids, pa.Array):
            fixed = _fixed_width(ids)
            if fixed is not None and fixed.dtype.itemsize == width:
                pos = np.searchsorted(self.ids, fixed).clip(0, len(self.ids) - 1)
                return np.asarray(self.ids[pos] == fixed)
            ids = [str(x) for x in ids.to_pylist()]
        probe = np.array([s.encode() for s in ids], dtype=object)
        fits = np.fromiter((len(b) <= width for b in probe), dtype=bool, count=len(probe))
        keys = probe.astype(f"S{width}")  # longer ids are truncated here, then masked out
        pos = np.searchsorted(self.ids, keys).clip(0, len(self.ids) - 1)
        return (self.ids[pos] == keys) & fits

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and bool(self.contains([job_id])[0])

    def to_list(self) -> list[str]:
        return [b.decode() for b in self.ids.tolist()]


def _fixed_width(arr: pa.Array) -> np.ndarray | None:
    """A view of a string array whose values all have one length as NumPy `S<width>`, or None.

    The values of such an array lie back to back in its data buffer: no Python object per id.
    """
    if arr.type != pa.string() or arr.null_count or len(arr) == 0:
        return None
    lengths = pc.binary_length(arr)
    low, high = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    if low != high or high == 0:
        return None
    offsets = np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4
    )
    return np.frombuffer(arr.buffers()[2], dtype=f"S{high}", count=len(arr), offset=int(offsets[0]))

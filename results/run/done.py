"""`DoneIds`: the ids of finished jobs, held compactly for resume checks.

A Python set of a million job ids costs ~100 MB of driver memory; one sorted NumPy array of
fixed-width bytes, built from the Arrow column without a Python string per id, costs 23 MB.
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
        return cls.from_arrays(column.chunks if isinstance(column, pa.ChunkedArray) else [column])

    @classmethod
    def from_arrays(cls, arrays: Sequence[pa.Array]) -> DoneIds:
        """From several Arrow string arrays (a streamed scan), without one big Arrow column."""
        arrays = [a.drop_null() for a in arrays]
        return cls.merge([_as_bytes(a) for a in arrays if len(a)])

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
        """Boolean mask: which of `keys` (NumPy `S<n>`) are done."""
        if not len(self.ids) or not len(keys):
            return np.zeros(len(keys), dtype=bool)
        width = self.ids.dtype.itemsize
        # a key longer than the ids is truncated by the cast, so it is masked out
        fits = np.char.str_len(keys) <= width if keys.dtype.itemsize > width else True
        keys = keys.astype(f"S{width}", copy=False)
        pos = np.searchsorted(self.ids, keys).clip(0, len(self.ids) - 1)
        return np.asarray((self.ids[pos] == keys) & fits)

    def contains(self, ids: Sequence[str] | pa.Array) -> np.ndarray:
        """Boolean mask: which of `ids` (strings, or an Arrow string array) are done."""
        if not len(self.ids) or not len(ids):
            return np.zeros(len(ids), dtype=bool)
        if isinstance(ids, pa.Array):
            return self.contains_bytes(_as_bytes(ids))
        return self.contains_bytes(np.array([s.encode() for s in ids]))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes)

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and bool(self.contains([job_id])[0])

    def to_list(self) -> list[str]:
        return [b.decode() for b in self.ids.tolist()]


def _as_bytes(arr: pa.Array) -> np.ndarray:
    """A non-empty string array as NumPy `S<width>`: where all values have one length, a view
    of its data buffer (the values lie back to back there: no Python object per id)."""
    lengths = pc.binary_length(arr)
    low, high = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    if arr.type != pa.string() or arr.null_count or low != high or high == 0:
        return np.array([str(s).encode() for s in arr.to_pylist()])
    offsets = np.frombuffer(
        arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4
    )
    return np.frombuffer(arr.buffers()[2], dtype=f"S{high}", count=len(arr), offset=int(offsets[0]))

"""Sequences versions share by appending: each version reads only its own first entries.

The in-memory indexes (vectors.VectorMatrix, postings.KeywordPostings) make a new version per write
while a reader may still use an older one. Entries below a version's size are never written again, so
the newest version appends in place and hands the same storage on; an older version, or a second version
made from it, gets a copy. Copying a million-entry id list or array per write cost the next query
milliseconds each at a million chunks (docs/benchmarks.md, "SQLite at 1M chunks").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

MIN_SPARE = 4096
"""Room a grown column leaves for later appends, at least (and an eighth of its size)."""


def extended(shared: list[str], size: int, more: list[str]) -> list[str]:
    """The first `size` entries of `shared`, then `more`: in place when `shared` ends at `size`."""
    if not more:
        return shared
    if len(shared) == size:
        shared.extend(more)
        return shared
    return shared[:size] + more


class Column:
    """A 1-D array with room to grow. Entries below `filled` are never written again."""

    __slots__ = ("array", "filled")

    def __init__(self, values: npt.NDArray[Any]) -> None:
        self.array = values
        self.filled = values.size

    def extended(self, size: int, more: npt.NDArray[Any]) -> tuple[Column, npt.NDArray[Any]]:
        """The column holding the first `size` entries, then `more`, and a view of those entries."""
        end = size + more.size
        if not more.size:
            return self, self.array[:size]
        if self.filled == size and end <= self.array.size:
            self.array[size:end] = more
            self.filled = end
            return self, self.array[:end]
        grown = Column(np.empty(end + max(MIN_SPARE, end // 8), dtype=self.array.dtype))
        grown.array[:size] = self.array[:size]
        grown.array[size:end] = more
        grown.filled = end
        return grown, grown.array[:end]

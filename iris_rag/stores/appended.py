"""Sequences versions share by appending: each version reads only its own first entries.

The in-memory indexes (the SQLite backend's VectorMatrix and KeywordPostings, NodeRAG's LeafMatrix, GraphRAG's
EntityTable) make a new version per write while a reader may still use an older one. Entries below a version's
size are never written again, so the newest version appends in place and hands the same storage on; an older
version, or a second version made from it, gets a copy. Copying a million-entry id list or array per write
cost the next query milliseconds each at a million chunks (docs/benchmarks.md, "SQLite at 1M chunks").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

MIN_SPARE = 4096
"""Rows a grown column leaves for later appends, at least (and an eighth of its size)."""


def extended(shared: list[str], size: int, more: list[str]) -> list[str]:
    """The first `size` entries of `shared`, then `more`: in place when `shared` ends at `size`."""
    if not more:
        return shared
    if len(shared) == size:
        shared.extend(more)
        return shared
    return shared[:size] + more


class Column:
    """An array of rows (entries of a 1-D array, rows of a matrix) with room to grow.

    Rows below `filled` are never written again.
    """

    __slots__ = ("array", "filled")

    def __init__(self, values: npt.NDArray[Any]) -> None:
        self.array = values
        self.filled = len(values)

    def extended(self, size: int, more: npt.NDArray[Any]) -> tuple[Column, npt.NDArray[Any]]:
        """The column holding the first `size` rows, then `more`, and a view of those rows."""
        end = size + len(more)
        if not len(more):
            return self, self.array[:size]
        if self.filled == size and end <= len(self.array):
            self.array[size:end] = more
            self.filled = end
            return self, self.array[:end]
        capacity = end + max(MIN_SPARE, end // 8)
        grown = Column(np.empty((capacity, *self.array.shape[1:]), dtype=self.array.dtype))
        grown.array[:size] = self.array[:size]
        grown.array[size:end] = more
        grown.filled = end
        return grown, grown.array[:end]

"""A read-only mapping shared between versions: a base dict and this version's few changes on top of it.

The in-memory matrix (vectors.py) makes a new version per write, and a reader may still be searching an
older one, so a version's lookups (chunk id → row, document → rows) cannot change under it. Copying them
per write cost 40-55 ms at a million chunks (docs/benchmarks.md, "SQLite at 1M chunks"), most of a
one-document ingest's next query. An Overlay keeps the base dict, which no version ever writes, and a
small dict of changes (a removed key maps to _GONE); a new version copies only the changes. When they
outgrow max(MIN_CHANGES, CHANGES_PER_SQRT x sqrt(base)) the version folds them into a new base: at a
million keys, one copy per 4,000 changed keys (some 800 writes of a new five-chunk document; a document
written again under the same chunk ids changes no more keys), instead of one per write.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")

MIN_CHANGES = 1024
"""Changes an overlay keeps before it folds them into a new base, at least."""
CHANGES_PER_SQRT = 4
"""...and up to this many per square root of the base's size (4,000 at a million keys)."""


class _Gone:
    """The marker of a key removed in the changes."""


_GONE = _Gone()


class Overlay(Mapping[_K, _V], Generic[_K, _V]):
    """An immutable mapping: `base` (never written) with `changes` on top (a key mapped to _GONE: removed)."""

    __slots__ = ("_base", "_changes", "_size")

    def __init__(self, base: dict[_K, _V] | None = None) -> None:
        self._base: dict[_K, _V] = base if base is not None else {}
        self._changes: dict[_K, _V | _Gone] = {}
        self._size = len(self._base)

    def __getitem__(self, key: _K) -> _V:
        value = self._changes.get(key, self._base.get(key, _GONE)) if self._changes else self._base[key]
        if isinstance(value, _Gone):
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        if self._changes and key in self._changes:
            return not isinstance(self._changes[key], _Gone)
        return key in self._base

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[_K]:
        for key in self._base:
            if key not in self._changes:
                yield key
        for key, value in self._changes.items():
            if not isinstance(value, _Gone):
                yield key

    def changed(self, removed: Iterable[_K], added: Iterable[tuple[_K, _V]]) -> Overlay[_K, _V]:
        """A new version: `removed` keys taken out (absent ones ignored), then `added` set; self unchanged."""
        result: Overlay[_K, _V] = Overlay.__new__(Overlay)
        result._base, result._changes, result._size = self._base, dict(self._changes), self._size
        for key in removed:  # (`in result` reads the changes made so far)
            if key in result:
                result._changes[key] = _GONE
                result._size -= 1
        for key, value in added:
            result._size += key not in result
            result._changes[key] = value
        limit = max(MIN_CHANGES, CHANGES_PER_SQRT * math.isqrt(len(self._base)))
        return result._folded() if len(result._changes) > limit else result

    def _folded(self) -> Overlay[_K, _V]:
        """The same mapping with its changes in a new base."""
        base = dict(self._base)
        for key, value in self._changes.items():
            if isinstance(value, _Gone):
                base.pop(key, None)
            else:
                base[key] = value
        return Overlay(base)

"""Each technique's storage for one store: made on first use from the backend's factories, then kept."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast

S = TypeVar("S")
T = TypeVar("T")


class TechniqueStorages(Generic[S]):
    """The store's implementations of the techniques' storage contracts (DocumentStore.technique_storage)."""

    def __init__(self, backend: str) -> None:
        self._backend = backend
        self._made: dict[type[Any], object] = {}
        self._lock = threading.Lock()

    def get(self, store: S, contract: type[T], factories: Mapping[type[Any], Callable[[S], object]]) -> T:
        """The storage for `contract`, made once; NotImplementedError where this backend has none."""
        with self._lock:
            storage = self._made.get(contract)
        if storage is None:
            factory = factories.get(contract)
            if factory is None:
                msg = f"the {self._backend} backend has no storage for {contract.__name__}"
                raise NotImplementedError(msg)
            # Made outside the lock: making one may open a connection or wait for the store's write lock
            # (SQLite's create their tables), which take locks of their own. Two threads may both make one;
            # the first is kept.
            made = factory(store)
            with self._lock:
                storage = self._made.setdefault(contract, made)
        return cast(T, storage)

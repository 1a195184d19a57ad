"""The embedded SQLite backend: one file, no server; each technique's storage in a module of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iris_rag.backends.sqlite.noderag import SqliteNodeTreeStorage
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.techniques.noderag.storage import NodeTreeStorage

# A technique's storage contract (techniques/<t>/storage.py) -> the class that implements it here.
TECHNIQUE_STORAGE: dict[type[Any], Callable[[SqliteStore], object]] = {
    NodeTreeStorage: SqliteNodeTreeStorage,
}

__all__ = ["TECHNIQUE_STORAGE", "SqliteStore"]

"""The embedded SQLite backend: one file, no server; each technique's storage in a module of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iris_rag.backends.sqlite.colbert import SqliteTokenVectors
from iris_rag.backends.sqlite.graphrag import SqliteKnowledgeGraph
from iris_rag.backends.sqlite.noderag import SqliteNodeTreeStorage
from iris_rag.backends.sqlite.sqlrag import SqliteStructuredTables
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
from iris_rag.techniques.noderag.storage import NodeTreeStorage
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage

# A technique's storage contract (techniques/<t>/storage.py) -> the class that implements it here.
TECHNIQUE_STORAGE: dict[type[Any], Callable[[SqliteStore], object]] = {
    KnowledgeGraphStorage: SqliteKnowledgeGraph,
    NodeTreeStorage: SqliteNodeTreeStorage,
    StructuredTableStorage: SqliteStructuredTables,
    TokenVectorStorage: SqliteTokenVectors,
}

__all__ = ["TECHNIQUE_STORAGE", "SqliteStore"]

"""The PostgreSQL backend (RAG_STORE=postgres): psycopg 3 with a pool, pgvector, BM25 in SQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iris_rag.backends.postgres.colbert import PostgresTokenVectors
from iris_rag.backends.postgres.graphrag import PostgresKnowledgeGraph
from iris_rag.backends.postgres.noderag import PostgresNodeTreeStorage
from iris_rag.backends.postgres.sqlrag import PostgresStructuredTables
from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
from iris_rag.techniques.noderag.storage import NodeTreeStorage
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage

# A technique's storage contract (techniques/<t>/storage.py) -> the class that implements it here.
TECHNIQUE_STORAGE: dict[type[Any], Callable[[PostgresStore], object]] = {
    KnowledgeGraphStorage: PostgresKnowledgeGraph,
    NodeTreeStorage: PostgresNodeTreeStorage,
    StructuredTableStorage: PostgresStructuredTables,
    TokenVectorStorage: PostgresTokenVectors,
}

__all__ = ["TECHNIQUE_STORAGE", "PostgresStore"]

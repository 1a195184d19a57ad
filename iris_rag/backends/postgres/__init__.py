"""The PostgreSQL backend (RAG_STORE=postgres): psycopg 3 with a pool, pgvector, BM25 in SQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iris_rag.backends.postgres.store import PostgresStore

# A technique's storage contract (techniques/<t>/storage.py) -> the class that implements it here.
# Empty so far: techniques with their own index (graphrag, noderag, colbert, sqlrag) are not served yet.
TECHNIQUE_STORAGE: dict[type[Any], Callable[[PostgresStore], object]] = {}

__all__ = ["TECHNIQUE_STORAGE", "PostgresStore"]

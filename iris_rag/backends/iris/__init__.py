"""The InterSystems IRIS backend (RAG_STORE=iris): intersystems-irispython (DB-API), VECTOR + HNSW, BM25.

The driver is imported by store.connect only, so this package imports without the iris extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from iris_rag.backends.iris.colbert import IrisTokenVectors
from iris_rag.backends.iris.noderag import IrisNodeTreeStorage
from iris_rag.backends.iris.store import IrisStore, IrisTarget
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.noderag.storage import NodeTreeStorage

# A technique's storage contract (techniques/<t>/storage.py) -> the class that implements it here. Not yet
# KnowledgeGraphStorage and StructuredTableStorage: the service refuses graphrag and sqlrag at start on
# IRIS, by name.
TECHNIQUE_STORAGE: dict[type[Any], Callable[[IrisStore], object]] = {
    NodeTreeStorage: IrisNodeTreeStorage,
    TokenVectorStorage: IrisTokenVectors,
}

__all__ = ["TECHNIQUE_STORAGE", "IrisStore", "IrisTarget"]

"""Build the configured store."""

from __future__ import annotations

from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentStore
from iris_rag.stores.sqlite.store import SqliteStore


def create_store(settings: Settings) -> DocumentStore:
    """The store RAG_STORE names (only the embedded SQLite store exists so far)."""
    return SqliteStore(settings.database_path)

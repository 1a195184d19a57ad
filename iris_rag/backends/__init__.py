"""Store backends, one folder each, behind the contract in iris_rag.stores; create_store picks one."""

from __future__ import annotations

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentStore


def create_store(settings: Settings) -> DocumentStore:
    """The store RAG_STORE names (only the embedded SQLite store exists so far)."""
    return SqliteStore(settings.database_path)

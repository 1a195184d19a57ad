"""The embedded SQLite backend: one file, no server."""

from iris_rag.stores.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]

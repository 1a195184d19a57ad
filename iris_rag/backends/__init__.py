"""Store backends, one folder each, behind the contract in iris_rag.stores; create_store picks one."""

from __future__ import annotations

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentStore


def create_store(settings: Settings) -> DocumentStore:
    """The store RAG_STORE names: the embedded SQLite file, or PostgreSQL at RAG_POSTGRES_URL."""
    if settings.store == "postgres":
        # Imported here: psycopg is an optional dependency (the postgres extra).
        from iris_rag.backends.postgres.store import PostgresStore

        assert settings.postgres_url is not None  # Settings refuses RAG_STORE=postgres without a URL
        return PostgresStore(
            settings.postgres_url.get_secret_value(), max_connections=settings.worker_threads + 4
        )
    return SqliteStore(settings.database_path)

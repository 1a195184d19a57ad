"""Store backends, one folder each, behind the contract in iris_rag.stores; create_store picks one."""

from __future__ import annotations

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentStore


def create_store(settings: Settings) -> DocumentStore:
    """The store RAG_STORE names: the SQLite file, PostgreSQL at RAG_POSTGRES_URL, or IRIS (IRIS_*)."""
    if settings.store == "iris":
        # Imported here: the IRIS driver is an optional dependency (the iris extra).
        from iris_rag.backends.iris.store import IrisStore, IrisTarget

        assert settings.iris_host is not None  # Settings refuses RAG_STORE=iris without IRIS_HOST
        password = settings.iris_password.get_secret_value() if settings.iris_password else ""
        return IrisStore(
            IrisTarget(
                settings.iris_host,
                settings.iris_port,
                settings.iris_namespace,
                settings.iris_username,
                password,
                settings.iris_connect_timeout_s,
            )
        )
    if settings.store == "postgres":
        # Imported here: psycopg is an optional dependency (the postgres extra).
        from iris_rag.backends.postgres.store import PostgresStore

        assert settings.postgres_url is not None  # Settings refuses RAG_STORE=postgres without a URL
        return PostgresStore(
            settings.postgres_url.get_secret_value(), max_connections=settings.worker_threads + 4
        )
    return SqliteStore(settings.database_path)

"""Store backends, one folder each, behind the contract in iris_rag.stores; create_store picks one."""

from __future__ import annotations

import sqlite3
import sys

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.errors import DatabaseConnectionFailedError
from iris_rag.redaction import redact
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentStore

CONNECT_TIMEOUT_S = 10
"""How long the start-up probe waits for the PostgreSQL server to accept a connection."""


def create_store(settings: Settings) -> DocumentStore:
    """The store RAG_STORE names: the embedded SQLite file, PostgreSQL at RAG_POSTGRES_URL, or IRIS (IRIS_*).

    An unreachable PostgreSQL server is DATABASE_CONNECTION_FAILED at once, not after the pool's wait.
    """
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
        import psycopg

        from iris_rag.backends.postgres.store import PostgresStore

        assert settings.postgres_url is not None  # Settings refuses RAG_STORE=postgres without a URL
        url = settings.postgres_url.get_secret_value()
        secrets = settings.llm_secrets  # the URL's password and its pieces (url_userinfo, with_pieces)
        try:
            psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()
        except psycopg.ProgrammingError as exc:
            # Only the URL's parsing raises it here: the driver's message quotes the URL, or a piece of it.
            msg = f"RAG_POSTGRES_URL is not a valid PostgreSQL URL: {_first_line(exc, secrets)}"
            raise DatabaseConnectionFailedError(msg) from None
        except Exception as exc:
            failure = connection_failure(exc, secrets)
            if failure is None:
                raise
            raise failure from exc
        try:
            return PostgresStore(url, max_connections=pool_size(settings))
        except psycopg.Error as exc:
            failure = connection_failure(exc, secrets)
            if failure is not None:
                raise failure from exc
            # The migrations' statements: a role without the right to create the tables, say.
            msg = f"the PostgreSQL store cannot be set up: {type(exc).__name__}: {_first_line(exc, secrets)}"
            raise DatabaseConnectionFailedError(msg) from None
    try:
        return SqliteStore(
            settings.database_path,
            ann_min_chunks=settings.sqlite_ann_min_chunks,
            ann_probe_share=settings.sqlite_ann_probe_share,
        )
    except (OSError, sqlite3.Error) as exc:  # RAG_DATA_DIR a file, read-only, on a full disk; a damaged file
        hint = _sqlite_hint(exc) if isinstance(exc, sqlite3.Error) else _UNWRITABLE_HINT
        msg = f"the SQLite store {settings.database_path} cannot be opened ({type(exc).__name__}: {exc})"
        raise DatabaseConnectionFailedError(f"{msg}; {hint}" if hint else msg) from None


def pool_size(settings: Settings) -> int:
    """The PostgreSQL connections one worker may hold.

    A thread keeps its connection for life (its technique storage reaches the very connection of its open
    transaction), and rag_sqlrag's statements take their own. The threads: WORKER_THREADS work threads,
    two control threads (worker/server.py), the monitor's writer, the index builder and the start-up
    thread; then SQL_MAX_CONCURRENT statements.
    """
    return settings.worker_threads + 2 + 1 + 1 + 1 + settings.sql_max_concurrent


def connection_failure(
    error: BaseException, secrets: list[str] | None = None
) -> DatabaseConnectionFailedError | None:
    """DATABASE_CONNECTION_FAILED if the error, or one it was raised from, says the store cannot be used.

    That is a PostgreSQL connection error (no SQLSTATE: refused, reset, closed; class 08; or the server
    shutting down, 57P01-57P03) or a pool that could not get a connection; or SQLite's file that cannot be
    written or read (a full disk, a file-size limit, a read-only file) or is damaged. A statement's own
    failure (a time-out, a constraint) is not.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatabaseConnectionFailedError):  # a store said so itself (IRIS's)
            return current
        if _lost_server(current):
            return DatabaseConnectionFailedError(
                f"the PostgreSQL server cannot be reached: {type(current).__name__}: "
                f"{_first_line(current, secrets or [])}"
            )
        if isinstance(current, sqlite3.Error) and (hint := _sqlite_hint(current)) is not None:
            return DatabaseConnectionFailedError(
                f"the SQLite store cannot be used ({type(current).__name__}: {current}); {hint}"
            )
        current = current.__cause__ or current.__context__
    return None


_UNWRITABLE_HINT = "RAG_DATA_DIR must be a folder this process can write, on a disk with free space"
_DAMAGED_HINT = (
    "its file is damaged or not an iris-rag database: restore it from a backup, or move it aside "
    "(iris-rag then starts an empty store); iris-rag never deletes it"
)
# SQLite's primary result codes (the low byte of an extended one) that say the file itself cannot be used.
_UNWRITABLE = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN}
_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def _sqlite_hint(error: sqlite3.Error) -> str | None:
    """What to do about a SQLite error that says the store's file cannot be used; None for any other."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None:
        return None
    if code & 0xFF in _DAMAGED:
        return _DAMAGED_HINT
    return _UNWRITABLE_HINT if code & 0xFF in _UNWRITABLE else None


def _first_line(error: BaseException, secrets: list[str]) -> str:
    """The driver's message, its first line, credentials masked (it may quote the URL, or a piece of it)."""
    said = str(error).strip()
    return redact(said.splitlines()[0], secrets) if said else ""


def _lost_server(error: BaseException) -> bool:
    # Only where the driver is loaded (RAG_STORE=postgres): never imported just to answer no.
    psycopg = sys.modules.get("psycopg")
    pool = sys.modules.get("psycopg_pool")
    if pool is not None and isinstance(error, pool.PoolTimeout):
        return True
    if psycopg is None or not isinstance(error, psycopg.OperationalError):
        return False
    state = getattr(error, "sqlstate", None)
    return state is None or state.startswith("08") or state in {"57P01", "57P02", "57P03"}

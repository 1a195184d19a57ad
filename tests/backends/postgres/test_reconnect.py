"""The PostgreSQL store after its server closed its connections (a restart, pg_terminate_backend).

pg_terminate_backend gives the store's connections what a restart gives them (AdminShutdown, then a dead
socket) without stopping the session's shared server. Each store thread keeps its own connection, so the
calls run on one long-lived thread, as the worker's threads are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import psycopg
import pytest

from iris_rag.backends import connection_failure
from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.stores.base import ChunkInput, DocumentInput

T = TypeVar("T")


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(postgres_url)
    yield opened
    opened.close()


class _Thread:
    """One thread that outlives the test's calls (a worker thread), running each function given."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self._executor = executor

    def __call__(self, function: Callable[[], T]) -> T:
        return self._executor.submit(function).result()


@pytest.fixture
def thread() -> Iterator[_Thread]:
    with ThreadPoolExecutor(1) as one:
        yield _Thread(one)


def _database(url: str) -> str:
    with psycopg.connect(url) as connection:
        name = connection.info.dbname
    return name


def _terminate(admin_url: str, database: str) -> None:
    """End every connection to the database, and wait until they are gone (as a server restart does)."""
    with psycopg.connect(admin_url, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
    assert ended and all(row[0] for row in ended)


def _allow_connections(admin_url: str, database: str, allowed: bool) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                psycopg.sql.Identifier(database), psycopg.sql.Literal(allowed)
            )
        )


def _document(doc_id: str) -> DocumentInput:
    vector = np.full(4, 0.5, dtype=np.float32)
    return DocumentInput(doc_id, "", "alpha beta", {}, [ChunkInput(0, "alpha beta", 0, 10, vector)])


def test_a_connection_closed_while_idle_is_replaced_before_the_next_call(
    store: PostgresStore, postgres_server: str, postgres_url: str, thread: _Thread
) -> None:
    thread(lambda: store.create_collection("c", "m", 4))
    with store.separate_connection():  # and one idle in the pool
        pass
    _terminate(postgres_server, _database(postgres_url))
    # The server is back at once: neither the thread's connection nor the pool's may fail a call.
    assert [c.id for c in thread(store.list_collections)] == ["c"]
    with ThreadPoolExecutor(1) as fresh:
        assert [c.id for c in fresh.submit(store.list_collections).result()] == ["c"]
    thread(lambda: store.upsert_documents("c", [_document("a")]))
    assert thread(lambda: store.get_document("c", "a")) is not None


def test_a_thread_recovers_once_the_server_accepts_connections_again(
    store: PostgresStore, postgres_server: str, postgres_url: str, thread: _Thread
) -> None:
    database = _database(postgres_url)
    store._pool.timeout = 1  # the pool's wait for a connection, shortened for the test
    assert thread(store.list_collections) == []
    _allow_connections(postgres_server, database, False)  # the server is "down" for this database
    try:
        _terminate(postgres_server, database)
        for _ in range(3):
            with pytest.raises(Exception) as raised:
                thread(store.list_collections)
            # DATABASE_CONNECTION_FAILED, not an INTERNAL_ERROR of the store's own bookkeeping.
            assert connection_failure(raised.value) is not None, repr(raised.value)
    finally:
        _allow_connections(postgres_server, database, True)
    deadline = time.monotonic() + 30
    while True:
        try:
            assert thread(store.list_collections) == []
            break
        except Exception as error:  # the pool reconnects in the background: a few calls may still fail
            assert connection_failure(error) is not None, repr(error)
            assert time.monotonic() < deadline, "the thread never got a working connection again"
            time.sleep(0.2)
    thread(store.ping)


def test_a_transaction_never_moves_to_another_connection(
    store: PostgresStore, postgres_server: str, postgres_url: str
) -> None:
    # Its later statements would run outside it (autocommit), so they must fail with it instead.
    store.create_collection("c", "m", 4)
    with pytest.raises(psycopg.OperationalError), store.transaction() as connection:
        _terminate(postgres_server, _database(postgres_url))
        with pytest.raises(psycopg.OperationalError):
            connection.execute("SELECT 1")
        assert store.connection() is connection
        store.connection().execute("SELECT 1")
    assert [c.id for c in store.list_collections()] == ["c"]


def test_the_pool_holds_every_thread_that_keeps_a_connection_and_sqlrags_statements(
    postgres_url: str,
) -> None:
    """Each worker thread keeps its connection for life: with work, control, monitor, builder and start-up
    threads all holding one, rag_sqlrag's statements found the pool (WORKER_THREADS + 4) empty."""
    from iris_rag.backends import create_store
    from iris_rag.settings import Settings

    settings = Settings(
        RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, WORKER_THREADS=2, SQL_MAX_CONCURRENT=2
    )
    made = create_store(settings)
    assert isinstance(made, PostgresStore)
    # The worker's threads that keep one: work, two control, the monitor, the index builder, the start-up one.
    keeping = settings.worker_threads + 2 + 1 + 1 + 1
    with ThreadPoolExecutor(keeping) as threads:
        try:
            barrier = threading.Barrier(keeping)

            def keep() -> None:
                made.ping()
                barrier.wait(timeout=30)  # every thread holds its connection at once

            list(threads.map(lambda _: keep(), range(keeping)))
            statements = ThreadPoolExecutor(settings.sql_max_concurrent)

            def statement() -> int:
                with made.separate_connection() as connection:
                    time.sleep(0.2)
                    row = connection.execute("SELECT 1 AS one").fetchone()
                    return -1 if row is None else int(row["one"])

            started = time.monotonic()
            assert list(statements.map(lambda _: statement(), range(settings.sql_max_concurrent))) == [1, 1]
            statements.shutdown()
            assert time.monotonic() - started < 3  # not the pool's 5 s wait for a connection
        finally:
            made.close()

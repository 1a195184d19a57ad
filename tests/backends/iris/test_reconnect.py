"""The IRIS store after its server restarted, on a stand-in driver (no IRIS server runs on these machines).

The stand-in answers every statement while its server's generation is the one a connection was opened in:
a restart bumps the generation, and every connection from before fails from then on, as a real one would.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from iris_rag.backends.iris.store import IrisConnectionError, IrisStore, IrisTarget


class _Server:
    def __init__(self) -> None:
        self.generation = 0
        self.up = True

    def restart(self, *, up: bool = True) -> None:
        self.generation += 1
        self.up = up


class _Connection:
    def __init__(self, server: _Server) -> None:
        self.server, self.generation = server, server.generation

    def check(self) -> None:
        if self.generation != self.server.generation:
            raise ConnectionResetError("the stand-in server restarted")

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    def commit(self) -> None:
        self.check()

    def rollback(self) -> None:
        self.check()

    def close(self) -> None:
        pass


class _Cursor:
    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.rowcount = 1

    def execute(self, statement: str, parameters: list[Any]) -> None:
        self.connection.check()

    def executemany(self, statement: str, parameters: list[list[Any]]) -> None:
        self.connection.check()

    def fetchall(self) -> list[tuple[int]]:
        return [(1,)]  # every table exists, migration step 1 is done, SELECT 1 answers


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> _Server:
    made = _Server()

    def connect(**_: Any) -> _Connection:
        if not made.up:
            raise ConnectionRefusedError("the stand-in server is down")
        return _Connection(made)

    monkeypatch.setitem(sys.modules, "iris", SimpleNamespace(connect=connect))
    return made


@pytest.fixture
def store(server: _Server) -> Iterator[IrisStore]:
    with socket.socket() as listener:  # connect() first reaches the port
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        opened = IrisStore(IrisTarget("127.0.0.1", int(listener.getsockname()[1]), password="Sup3rSecret!"))
        yield opened
        opened.close()


def test_a_thread_connects_again_after_the_server_restarted(store: IrisStore, server: _Server) -> None:
    store.ping()
    server.restart()
    # The call that finds the connection dead says so (DATABASE_CONNECTION_FAILED); the next one reconnects.
    with pytest.raises(IrisConnectionError, match="connection to IRIS") as lost:
        store.ping()
    assert lost.value.code == "DATABASE_CONNECTION_FAILED" and "Sup3rSecret!" not in str(lost.value)
    store.ping()
    server.restart(up=False)
    for _ in range(2):
        with pytest.raises(IrisConnectionError):
            store.ping()
    server.up = True
    store.ping()


def test_a_transaction_fails_with_its_lost_connection_and_the_next_call_reconnects(
    store: IrisStore, server: _Server
) -> None:
    with pytest.raises(IrisConnectionError), store.transaction() as connection:
        server.restart()
        with pytest.raises(IrisConnectionError):
            store.execute("UPDATE t SET x = 1")
        # Never another connection inside the transaction: its later statements would be outside it.
        assert store.connection() is connection
        store.execute("UPDATE t SET x = 2")
    store.ping()

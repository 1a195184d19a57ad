"""A test double of the `iris` driver: SQLite under the documented IRIS rules these tests check.

No IRIS server runs on these machines. This double runs the store's real SQL on SQLite, translated as
literally as it can be (TOP -> LIMIT, VARCHAR -> TEXT, VECTOR -> BLOB, INFORMATION_SCHEMA.TABLES -> a view),
and copies only these rules of InterSystems' documentation, each as a test needs it:

- Collation (GSQL_collation_tabledef): a string column is SQLUPPER unless declared COLLATE EXACT, so `=`,
  IN and keys ignore case and trailing spaces, and GROUP BY / DISTINCT give the upper-cased value. ALTER
  TABLE ... ALTER COLUMN ... COLLATE changes it, after which the table's indexes are invalid until BUILD
  INDEX FOR TABLE (here: every statement on the table fails until then).
- LOCK TABLE ... IN EXCLUSIVE MODE (RSQL_lock) holds until an UNLOCK or the connection's process ends,
  COMMIT or not; UNLOCK without IMMEDIATE takes effect as the transaction ends (RSQL_unlock). Another
  process's LOCK fails with SQLCODE -110 (here at once, not after the 10 s LockTimeout).
- A VARCHAR(n) value longer than n fails with SQLCODE -104, and an index entry whose string values pass 511
  encoded bytes with <SUBSCRIPT> (the global reference limit); a duplicate key with SQLCODE -119.
- The isolation level is READ UNCOMMITTED until SET TRANSACTION ISOLATION LEVEL says otherwise (recorded).
- rowcount is -1: sqlalchemy-iris marks this driver supports_sane_rowcount = False.
- TO_VECTOR(data, type, length) (RSQL_tovector): comma-separated text, optionally in brackets, padded with
  zeros or cut to `length`; stored here as the elements' bytes behind a type tag. VECTOR_COSINE and
  VECTOR_DOT_PRODUCT (RSQL_vectorcosine, RSQL_vectordotproduct) over two such vectors: SQLCODE -257 for
  lengths that differ, -259 for types that differ. An HNSW index (CREATE INDEX ... AS HNSW) is accepted and
  never built: a search through it here is exact, so this double says nothing of the index's recall.

One SQLite file is the server; each connection is one IRIS process. `install` puts it in place of the
`iris` module for one test, in this process only (a subprocess imports the real driver).
"""

from __future__ import annotations

import re
import socket
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

_COLUMN = re.compile(r"(\w+)(\s+)VARCHAR\((\d+)\)(\s+COLLATE\s+%?(\w+))?", re.IGNORECASE)


def _sqlupper(value: str) -> str:
    return value.rstrip().upper()


# A stored vector: one tag byte for its element type, then its elements (NumPy's native byte order).
_VECTOR_TYPES: dict[str, tuple[bytes, type[np.generic]]] = {
    "FLOAT": (b"f", np.float32),
    "DOUBLE": (b"d", np.float64),
    "INTEGER": (b"i", np.int64),
    "INT": (b"i", np.int64),
}
_TAGS = {tag: dtype for tag, dtype in _VECTOR_TYPES.values()}


def _to_vector(data: str, kind: str, length: int) -> bytes:
    tag, dtype = _VECTOR_TYPES[kind.upper()]
    text = data.strip().removeprefix("[").removesuffix("]")
    values = np.asarray([float(v) for v in text.split(",")], dtype=np.float64).astype(dtype)
    values = np.concatenate([values[:length], np.zeros(max(0, length - len(values)), dtype=dtype)])
    return tag + values.tobytes()


def _vectors(a: bytes, b: bytes) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    if a[:1] != b[:1]:
        raise _error(-259, "vectors of different types")
    first = np.frombuffer(a, dtype=_TAGS[a[:1]], offset=1).astype(np.float64)
    second = np.frombuffer(b, dtype=_TAGS[b[:1]], offset=1).astype(np.float64)
    if len(first) != len(second):
        raise _error(-257, f"vectors of lengths {len(first)} and {len(second)}")
    return first, second


def _vector_dot_product(a: bytes, b: bytes) -> float:
    first, second = _vectors(a, b)
    return float(first @ second)


def _vector_cosine(a: bytes, b: bytes) -> float:
    first, second = _vectors(a, b)
    return float(first @ second / (np.linalg.norm(first) * np.linalg.norm(second)))


@dataclass
class _Column:
    collation: str  # "EXACT" or "SQLUPPER"
    length: int


@dataclass
class Server:
    """The IRIS instance: its tables' column rules, its table locks, what its processes said."""

    path: Path
    columns: dict[tuple[str, str], _Column] = field(default_factory=dict)
    indexes: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    invalid_indexes: set[str] = field(default_factory=set)
    table_locks: dict[str, int] = field(default_factory=dict)  # table -> id of the holding connection
    statements: list[str] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def connect(self, **_: Any) -> Connection:
        connection = Connection(self)
        with self.guard:
            self.connections.append(connection)
        return connection

    def compare(self, table: str, column: str, a: str, b: str) -> int:
        if self.columns[(table, column)].collation != "EXACT":
            a, b = _sqlupper(a), _sqlupper(b)
        return (a > b) - (a < b)

    def sqlupper(self, table: str, column: str) -> bool:
        found = self.columns.get((table, column))
        return found is not None and found.collation != "EXACT"


def install(path: Path, monkeypatch: pytest.MonkeyPatch) -> Server:
    """A server on a new SQLite file, answering `iris.connect` in this process until the test ends."""
    server = Server(path)
    monkeypatch.setitem(sys.modules, "iris", SimpleNamespace(connect=server.connect))
    return server


@contextmanager
def listening_port() -> Iterator[int]:
    """A local port that accepts connections: the store reaches the superserver port before it logs in."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def _error(code: int, text: str) -> RuntimeError:
    return RuntimeError(f"[SQLCODE: <{code}>:<{text}>]")


class Connection:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.db = sqlite3.connect(server.path, timeout=2, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE VIEW IF NOT EXISTS INFORMATION_SCHEMA_TABLES AS SELECT "
            "substr(name, 1, instr(name, '_') - 1) AS TABLE_SCHEMA, substr(name, instr(name, '_') + 1) "
            "AS TABLE_NAME FROM sqlite_master WHERE type = 'table'"
        )
        for name, arity, function in (
            ("TO_VECTOR", 3, _to_vector),
            ("VECTOR_COSINE", 2, _vector_cosine),
            ("VECTOR_DOT_PRODUCT", 2, _vector_dot_product),
        ):
            self.db.create_function(name, arity, self._reporting(function), deterministic=True)
        self.isolation = "READ UNCOMMITTED"
        self.collations: set[str] = set()
        self.deferred_unlocks: list[str] = []
        self.closed = False
        # SQLite reports a function's exception only as "user-defined function raised exception".
        self.function_error: RuntimeError | None = None

    def _reporting(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*arguments: Any) -> Any:
            try:
                return function(*arguments)
            except RuntimeError as exc:
                self.function_error = exc
                raise

        return call

    def cursor(self) -> Cursor:
        return Cursor(self)

    def _register_collations(self) -> None:
        for table, column in list(self.server.columns):
            name = f"C_{table}_{column}"
            if name not in self.collations:
                self.db.create_collation(name, self._collation(table, column))
                self.collations.add(name)

    def _collation(self, table: str, column: str) -> Callable[[str, str], int]:
        return lambda a, b: self.server.compare(table, column, a, b)

    def begin(self) -> None:
        if not self.db.in_transaction:
            self.db.execute("BEGIN")

    def _end(self, verb: str) -> None:
        if self.db.in_transaction:
            self.db.execute(verb)
        with self.server.guard:
            for table in self.deferred_unlocks:
                if self.server.table_locks.get(table) == id(self):
                    del self.server.table_locks[table]
            self.deferred_unlocks.clear()

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        self._end("ROLLBACK")

    def close(self) -> None:
        with self.server.guard:  # the process ends, and every lock it held with it
            for table in [t for t, holder in self.server.table_locks.items() if holder == id(self)]:
                del self.server.table_locks[table]
        self.closed = True
        self.db.close()


class Cursor:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.server = connection.server
        self.rowcount = -1
        self._rows: list[tuple[Any, ...]] = []

    def execute(self, statement: str, parameters: list[Any] | None = None) -> None:
        self._run(statement, [list(parameters or [])])

    def executemany(self, statement: str, parameters: list[list[Any]]) -> None:
        self._run(statement, [list(p) for p in parameters])

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def _run(self, statement: str, many: list[list[Any]]) -> None:
        server, connection = self.server, self.connection
        server.statements.append(statement)
        self._rows = []
        text = " ".join(statement.split())
        if match := re.fullmatch(r"SET TRANSACTION ISOLATION LEVEL (.+)", text):
            connection.isolation = match.group(1)
            return
        if match := re.fullmatch(r"LOCK TABLE (\S+) IN EXCLUSIVE MODE", text):
            with server.guard:
                holder = server.table_locks.get(match.group(1))
                if holder not in (None, id(connection)):
                    raise _error(-110, f"Lock timeout occurred: table {match.group(1)} is locked")
                server.table_locks[match.group(1)] = id(connection)
            return
        if match := re.fullmatch(r"UNLOCK TABLE (\S+) IN EXCLUSIVE MODE( IMMEDIATE)?", text):
            if match.group(2) or not connection.db.in_transaction:
                with server.guard:
                    server.table_locks.pop(match.group(1), None)
            else:
                connection.deferred_unlocks.append(match.group(1))
            return
        if " AS HNSW(" in text:
            return
        if match := re.fullmatch(r"BUILD INDEX FOR TABLE (\S+)", text):
            table = match.group(1).replace(".", "_")
            connection.begin()
            connection.db.execute(f"REINDEX {table}")
            server.invalid_indexes.discard(table)
            return
        if match := re.fullmatch(r"ALTER TABLE (\S+) ALTER COLUMN (\w+) COLLATE %?(\w+)", text):
            table = match.group(1).replace(".", "_")
            server.columns[(table, match.group(2))].collation = match.group(3).upper()
            server.invalid_indexes.add(table)  # its subscripts were collated the other way
            return
        tables = {t.replace(".", "_") for t in re.findall(r"IrisRag\.\w+", text)}
        if tables & server.invalid_indexes:
            raise _error(
                -400, f"the indexes of {sorted(tables & server.invalid_indexes)} must be built again"
            )
        sql = self._translate(statement)
        if text.startswith("CREATE ") and "INDEX" in text.split("(")[0]:
            index = re.search(r"ON (\S+) \(([^)]*)\)", text)
            assert index is not None
            table = index.group(1).replace(".", "_")
            server.indexes.setdefault(table, []).append(tuple(c.strip() for c in index.group(2).split(",")))
        if text.startswith("INSERT INTO "):
            self._check_values(text, many)
        connection._register_collations()
        connection.begin()
        connection.function_error = None
        try:
            if len(many) == 1:
                cursor = connection.db.execute(sql, many[0])
                self._rows = [tuple(row) for row in cursor.fetchall()] if cursor.description else []
            else:
                connection.db.executemany(sql, many)
        except sqlite3.IntegrityError as exc:
            raise _error(-119, f"UNIQUE or PRIMARY KEY Constraint failed uniqueness check ({exc})") from exc
        except sqlite3.OperationalError as exc:
            if connection.function_error is not None:
                raise connection.function_error from exc
            if "locked" in str(exc):
                raise _error(-110, f"Lock timeout occurred ({exc})") from exc
            raise

    def _translate(self, statement: str) -> str:
        server = self.server
        text = statement
        create = re.match(r"\s*(CREATE TABLE|ALTER TABLE) (IrisRag\.\w+)", text)
        if create:
            table = create.group(2).replace(".", "_")

            def column(match: re.Match[str]) -> str:
                collation = (match.group(5) or "SQLUPPER").upper()
                server.columns[(table, match.group(1))] = _Column(collation, int(match.group(3)))
                return f"{match.group(1)}{match.group(2)}TEXT COLLATE C_{table}_{match.group(1)}"

            text = _COLUMN.sub(column, text)
            key = re.search(r"PRIMARY KEY \(([^)]*)\)", text)
            if key:
                server.indexes.setdefault(table, []).append(tuple(c.strip() for c in key.group(1).split(",")))
            for name in re.findall(r"(\w+)\s+TEXT COLLATE \S+ NOT NULL PRIMARY KEY", text):
                server.indexes.setdefault(table, []).append((name,))
        text = text.replace("IrisRag.", "IrisRag_").replace(
            "INFORMATION_SCHEMA.TABLES", "INFORMATION_SCHEMA_TABLES"
        )
        text = re.sub(r"VARBINARY\(\d+\)", "BLOB", text)
        text = text.replace("LONGVARCHAR", "TEXT")
        text = re.sub(r"VECTOR\(FLOAT, \d+\)", "BLOB", text)
        text = re.sub(r"TO_VECTOR\((\?), (\w+), (\d+)\)", r"TO_VECTOR(\1, '\2', \3)", text)
        text = text.replace("%EXACT(", "(")
        top = re.match(r"\s*SELECT TOP (\d+) (.*)$", text, re.S)
        if top:
            text = f"SELECT {top.group(2)} LIMIT {top.group(1)}"
        # GROUP BY and DISTINCT on an SQLUPPER column give the collated (upper-cased) value.
        tables = re.findall(r"IrisRag_\w+", text)
        grouped = re.search(r"GROUP BY (\w+)\s*$", text) or re.match(r"\s*SELECT DISTINCT (\w+)", text)
        if grouped and any(server.sqlupper(t, grouped.group(1)) for t in tables):
            name = grouped.group(1)
            text = re.sub(rf"^(\s*SELECT (?:DISTINCT )?){name}\b", rf"\1UPPER({name})", text)
        return text

    def _check_values(self, text: str, many: list[list[Any]]) -> None:
        """VARCHAR lengths (SQLCODE -104) and the 511-byte subscript limit of index entries."""
        match = re.match(r"INSERT INTO (\S+) \(([^)]*)\) VALUES \((.*)\)$", text)
        if match is None:
            return
        table = match.group(1).replace(".", "_")
        columns = [c.strip() for c in match.group(2).split(",")]
        values = [v.strip() for v in re.split(r",(?![^(]*\))", match.group(3))]
        marks = [c for c, v in zip(columns, values, strict=True) if "?" in v]
        for row in many:
            named = dict(zip(marks, row, strict=True))
            for name, value in named.items():
                rule = self.server.columns.get((table, name))
                if rule is not None and isinstance(value, str) and len(value) > rule.length:
                    raise _error(
                        -104, f"Field {table}.{name} VALUE LENGTH {len(value)} > MAXLEN {rule.length}"
                    )
            for index in self.server.indexes.get(table, []):
                size = sum(len(str(named.get(c, "")).encode("utf-8")) + 2 for c in index)
                if size > 511:
                    raise RuntimeError(f"<SUBSCRIPT> index entry of {table} {index} is {size} bytes")

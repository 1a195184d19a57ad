"""rag_sqlrag's storage on SQLite: structured tables, documents views and read-only checked SELECTs.

Tables are real SQLite tables, documents views read the documents' JSON metadata with json_extract, and a
checked SELECT runs on a read-only connection under an authorizer, a progress handler and a watchdog.

Every queryable object is listed in the registry table `structured_tables`; nothing else can be queried.
A checked statement runs on its own thread: a built-in function that loops in C (instr or replace over
megabyte strings) never reaches the progress handler, so the caller is answered at the time limit whatever
the statement does, while the gate keeps the slot until the thread really ends.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote as url_quote

import orjson

from iris_rag.backends.sqlite.filters import json_path
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import InvalidParametersError, RetrievalFailedError, SqlRejectedError
from iris_rag.techniques.sqlrag.storage import (
    CheckedSql,
    ColumnType,
    NewTable,
    SelectLimits,
    SqlResult,
    StatementGate,
    TableInfo,
    TableKind,
    TruncatedBy,
    ViewSpec,
    collect_rows,
    fit_name,
    table_info,
)

REGISTRY_TABLE = "structured_tables"

# How each inferred type is declared: dates stay ISO 8601 text, so they compare and sort as dates.
SQL_TYPES: dict[ColumnType, str] = {
    "INTEGER": "INTEGER",
    "REAL": "REAL",
    "BOOLEAN": "INTEGER",
    "DATE": "TEXT",
    "DATETIME": "TEXT",
    "TEXT": "TEXT",
    "JSON": "TEXT",
}

_REGISTRY_DDL = f"""
CREATE TABLE IF NOT EXISTS {REGISTRY_TABLE} (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL,
    source_name   TEXT NOT NULL,
    collection_id TEXT,
    columns       TEXT NOT NULL,
    row_count     INTEGER NOT NULL,
    source        TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL
)"""

_SELECT = (
    "SELECT name, kind, source_name, collection_id, columns, row_count, source, created_at, updated_at "
    f"FROM {REGISTRY_TABLE}"
)

# VM instructions between two looks at the clock.
_PROGRESS_STEP = 1_000
# How often the caller looks at the statement's thread (its cancel token, its time limit).
_WATCH_INTERVAL_S = 0.05


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def quote(identifier: str) -> str:
    """An SQL identifier in double quotes."""
    return '"' + identifier.replace('"', '""') + '"'


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _info(row: Sequence[Any]) -> TableInfo:
    return table_info(row, orjson.loads(row[4]))


class SqliteStructuredTables:
    """StructuredTableStorage on the store's SQLite file (the calling thread's connection)."""

    dialect = "sqlite"

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.connection().execute(_REGISTRY_DDL)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """The store's write transaction (under its writer lock): COMMIT, or ROLLBACK on any exception."""
        with self.store.write_transaction():
            yield

    # The registry
    def list_tables(self) -> list[TableInfo]:
        """Every registered table and view, tables first, by name."""
        rows = self.store.connection().execute(f"{_SELECT} ORDER BY kind DESC, name").fetchall()
        return [_info(row) for row in rows]

    def get_table(self, name: str) -> TableInfo | None:
        """One registry entry by its SQL name (case-insensitive)."""
        row = self.store.connection().execute(f"{_SELECT} WHERE name = ?", (name.lower(),)).fetchone()
        return _info(row) if row else None

    def view_for(self, collection_id: str) -> TableInfo | None:
        """The registered documents view of a collection, if it was built."""
        row = (
            self.store.connection()
            .execute(f"{_SELECT} WHERE kind = 'documents_view' AND collection_id = ?", (collection_id,))
            .fetchone()
        )
        return _info(row) if row else None

    def counts(self) -> dict[TableKind, int]:
        """How many tables and documents views are registered."""
        rows = (
            self.store.connection()
            .execute(f"SELECT kind, COUNT(*) FROM {REGISTRY_TABLE} GROUP BY kind")
            .fetchall()
        )
        return {kind: int(count) for kind, count in rows}

    def object_names(self) -> list[str]:
        """Every name in sqlite_master."""
        return [row[0] for row in self.store.connection().execute("SELECT name FROM sqlite_master")]

    def _upsert(self, info: TableInfo) -> None:
        columns = orjson.dumps([{"name": c.name, "source": c.source, "type": c.type} for c in info.columns])
        self.store.connection().execute(
            f"INSERT OR REPLACE INTO {REGISTRY_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                info.name,
                info.kind,
                info.source_name,
                info.collection_id,
                columns.decode(),
                info.row_count,
                info.source,
                info.created_at,
                info.updated_at,
            ),
        )

    # Tables
    def replace_table(
        self, table: NewTable, may_replace: Callable[[TableInfo], None]
    ) -> tuple[TableInfo, TableInfo | None]:
        """DROP, CREATE, INSERT and register in one transaction (a failure leaves the old table)."""
        connection = self.store.connection()
        sql_name = table.name
        definition = ", ".join(f"{quote(c.name)} {SQL_TYPES[c.type]}" for c in table.columns)
        placeholders = ", ".join("?" * len(table.columns))
        now = _now()
        with self.transaction():
            existing = self.get_table(sql_name)
            other = connection.execute(
                "SELECT type FROM sqlite_master WHERE lower(name) = ?", (sql_name,)
            ).fetchone()
            # Also a documents view: only a table replaces a table (the technique's names cannot clash).
            if other is not None and (existing is None or existing.kind != "table"):
                msg = (
                    f"a {other[0]} named {sql_name!r} exists and is not a structured table; "
                    "choose another name"
                )
                raise InvalidParametersError(msg)
            if existing is not None:  # BEGIN IMMEDIATE: no other writer can change it until COMMIT
                may_replace(existing)
            connection.execute(f"DROP TABLE IF EXISTS {quote(sql_name)}")
            connection.execute(f"CREATE TABLE {quote(sql_name)} ({definition})")
            connection.executemany(f"INSERT INTO {quote(sql_name)} VALUES ({placeholders})", table.rows)
            info = TableInfo(
                name=sql_name,
                kind="table",
                source_name=table.source_name,
                collection_id=table.collection_id,
                columns=table.columns,
                row_count=len(table.rows),
                source=table.source,
                created_at=existing.created_at if existing else now,
                updated_at=now,
            )
            self._upsert(info)
        return info, existing

    # Documents views
    def _free_view_name(self, base: str) -> str:
        name, n = fit_name(base), 2
        # Two collection ids can map to one name ('a-b', 'a_b'): the later one gets a suffix.
        while (
            self.store.connection()
            .execute("SELECT 1 FROM sqlite_master WHERE lower(name) = ?", (name,))
            .fetchone()
        ):
            name, n = fit_name(f"{base}_{n}"), n + 1
        return name

    def save_view(self, view: ViewSpec, *, rebuild: bool) -> TableInfo:
        """Register the view (recreated over json_extract when rebuild), inside the caller's transaction."""
        connection = self.store.connection()
        existing = self.view_for(view.collection_id)
        name = existing.name if existing else self._free_view_name(view.base_name)
        if rebuild or existing is None:
            selects = [quote(c.name) for c in view.document_columns] + [
                f"json_extract(metadata, {_sql_text(json_path(c.source))}) AS {quote(c.name)}"
                for c in view.metadata_columns
            ]
            connection.execute(f"DROP VIEW IF EXISTS {quote(name)}")
            connection.execute(
                f"CREATE VIEW {quote(name)} AS SELECT {', '.join(selects)} FROM documents "
                f"WHERE collection_id = {_sql_text(view.collection_id)}"
            )
        now = _now()
        info = TableInfo(
            name=name,
            kind="documents_view",
            source_name=view.collection_id,
            collection_id=view.collection_id,
            columns=view.document_columns + view.metadata_columns,
            row_count=self.document_count(view.collection_id),
            source=view.source,
            created_at=existing.created_at if existing else now,
            updated_at=now,
        )
        self._upsert(info)
        return info

    def drop_collection(self, collection_id: str) -> None:
        """Drop the collection's view and tables and their registry entries (in the caller's transaction)."""
        connection = self.store.connection()
        for info in [t for t in self.list_tables() if t.collection_id == collection_id]:
            kind = "VIEW" if info.kind == "documents_view" else "TABLE"
            connection.execute(f"DROP {kind} IF EXISTS {quote(info.name)}")
            connection.execute(f"DELETE FROM {REGISTRY_TABLE} WHERE name = ?", (info.name,))

    def document_count(self, collection_id: str) -> int:
        """Documents of the collection now."""
        row = (
            self.store.connection()
            .execute("SELECT COUNT(*) FROM documents WHERE collection_id = ?", (collection_id,))
            .fetchone()
        )
        return int(row[0])

    def document_metadata(self, collection_id: str) -> list[dict[str, Any]]:
        """Each document's metadata."""
        rows = (
            self.store.connection()
            .execute("SELECT metadata FROM documents WHERE collection_id = ?", (collection_id,))
            .fetchall()
        )
        return [orjson.loads(row[0]) for row in rows]

    def samples(self, table: TableInfo, limit: int) -> list[list[Any]]:
        """Distinct non-null values of each column (blobs as they are stored)."""
        connection = self.store.connection()
        return [
            [
                row[0]
                for row in connection.execute(
                    f"SELECT DISTINCT {quote(column.name)} FROM {quote(table.name)} "
                    f"WHERE {quote(column.name)} IS NOT NULL LIMIT ?",
                    (limit,),
                ).fetchall()
            ]
            for column in table.columns
        ]

    # Statements
    def run_select(self, checked: CheckedSql, limits: SelectLimits, gate: StatementGate) -> SqlResult:
        """execute_readonly() on the store's database file."""
        return execute_readonly(_database_file(self.store.connection()), checked, limits, gate)


def _database_file(connection: sqlite3.Connection) -> Path:
    """The file behind the store's connection (what the read-only connection opens)."""
    for _, name, file in connection.execute("PRAGMA database_list").fetchall():
        if name == "main" and file:
            return Path(file)
    msg = "the store has no database file to open read-only"
    raise RetrievalFailedError(msg)


def _reject(reason: str) -> NoReturn:
    msg = f"SQL rejected: {reason}"
    raise SqlRejectedError(msg, {"reason": reason, "stage": "execution"})


def readonly_connection(database: Path, limits: SelectLimits) -> sqlite3.Connection:
    """A connection that cannot write: opened mode=ro, PRAGMA query_only, SQLite's limits lowered.

    trusted_schema stays on: the documents views call json_extract, which SQLite 3.40 does not mark
    innocuous; the authorizer already limits every function call, inside views too, to the allowed ones.
    """
    uri = f"file:{url_quote(str(database.resolve()))}?mode=ro"
    connection = sqlite3.connect(uri, uri=True, timeout=5.0, isolation_level=None, check_same_thread=False)
    for limit, value in (
        (sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes),
        (sqlite3.SQLITE_LIMIT_SQL_LENGTH, 4 * limits.max_sql_chars),
        (sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 200),
        (sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 20),
        (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
        (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_pattern_chars),
    ):
        connection.setlimit(limit, value)
    connection.execute("PRAGMA query_only = ON")
    return connection


@dataclass(slots=True)
class _Outcome:
    """What the statement's thread hands back to the caller."""

    done: threading.Event = field(default_factory=threading.Event)
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    truncated_by: TruncatedBy | None = None
    error: Exception | None = None


def _cell(value: Any) -> Any:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


def execute_readonly(
    database: Path, checked: CheckedSql, limits: SelectLimits, gate: StatementGate
) -> SqlResult:
    """Run a checked statement read-only under the authorizer, the gate and the time limit."""
    allowed_names = {name.lower() for name in limits.allowed} | set(checked.ctes)
    view_names = {name.lower() for name in limits.views}
    denied: list[str] = []

    def authorizer(
        action: int, first: str | None, second: str | None, database: str | None, source: str | None
    ) -> int:
        if action == sqlite3.SQLITE_SELECT:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ and database in (None, "main"):
            table = (first or "").lower()
            # A documents view reads the documents table: allowed only through an allowed view. count(*)
            # over a view asks for the table itself with no column and no view named: no column is read.
            through_view = (source or "").lower() in view_names or (bool(view_names) and not second)
            if table in allowed_names or (table == "documents" and through_view):
                return sqlite3.SQLITE_OK
            denied.append(f"reading table {first!r}")
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and (second or "").lower() in limits.functions:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_RECURSIVE and limits.allow_recursive:
            return sqlite3.SQLITE_OK
        denied.append(_action_name(action, first, second))
        return sqlite3.SQLITE_DENY

    timeout_ms = limits.timeout_ms
    limit_s = timeout_ms / 1000
    gate.acquire(limit_s)
    started = time.monotonic()
    deadline = started + limit_s
    timed_out = False

    def progress() -> int:
        nonlocal timed_out
        timed_out = timed_out or time.monotonic() > deadline
        return int(timed_out)

    try:
        connection = readonly_connection(database, limits)
    except BaseException:
        gate.release()
        raise
    outcome = _Outcome()

    def run() -> None:
        try:
            connection.set_authorizer(authorizer)
            connection.set_progress_handler(progress, _PROGRESS_STEP)
            cursor = connection.execute(checked.executed_sql)
            outcome.columns = [d[0] for d in cursor.description or ()]
            # Row by row (the cursor steps the statement as it is read), within the result size budget.
            outcome.rows, outcome.truncated_by = collect_rows(cursor, _cell, checked, limits)
        except Exception as exc:  # raised again on the caller's thread (SQL_REJECTED for SQLite's own)
            outcome.error = exc
        finally:
            connection.close()
            gate.release()
            outcome.done.set()

    threading.Thread(target=run, name="sql-statement", daemon=True).start()
    while not outcome.done.wait(_WATCH_INTERVAL_S):
        try:
            check_cancelled()
        except BaseException:
            connection.interrupt()
            raise
        if time.monotonic() > deadline + _WATCH_INTERVAL_S:
            # Stuck inside one C function: answer now; the thread ends (and frees its slot) on its own.
            timed_out = True
            connection.interrupt()
            _reject(_execution_reason(sqlite3.OperationalError("interrupted"), [], True, limits))
    if isinstance(outcome.error, sqlite3.Error):
        _reject(_execution_reason(outcome.error, denied, timed_out, limits))
    if outcome.error is not None:
        raise outcome.error
    elapsed = (time.monotonic() - started) * 1000
    return SqlResult(outcome.columns, outcome.rows, outcome.truncated_by, round(elapsed, 3), denied)


_ACTIONS = {
    code: name
    for name in """CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER
    CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE
    DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ SELECT TRANSACTION UPDATE
    ATTACH DETACH ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE FUNCTION SAVEPOINT
    RECURSIVE""".split()
    if isinstance(code := getattr(sqlite3, f"SQLITE_{name}", None), int)
}


def _action_name(action: int, first: str | None, second: str | None) -> str:
    if action == sqlite3.SQLITE_FUNCTION:
        return f"calling function {second}()"
    what = " ".join(repr(v) for v in (first, second) if v)
    return f"{_ACTIONS.get(action, str(action))} {what}".strip()


def _execution_reason(exc: sqlite3.Error, denied: list[str], timed_out: bool, limits: SelectLimits) -> str:
    message = str(exc)
    if timed_out:
        return f"it ran past the {limits.timeout_ms} ms time limit and was stopped"
    if denied:
        return f"not authorized: {denied[0]}"
    if "readonly" in message or "read-only" in message:
        return "it tried to write; the connection is read-only"
    if "too big" in message:
        return f"a value grew past {limits.max_value_bytes} bytes"
    if "pattern too complex" in message:
        return f"a LIKE/GLOB pattern longer than {limits.max_pattern_chars} characters"
    return f"SQLite error: {message}"

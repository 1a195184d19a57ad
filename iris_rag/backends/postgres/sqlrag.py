"""rag_sqlrag's storage on PostgreSQL: structured tables and documents views in schema `sqlrag`.

Tables are real tables in the `sqlrag` schema, documents views read the documents' JSONB metadata, and the
registry (`structured_tables`, schema migration 7) lists every queryable object. A checked SELECT runs on
a connection of its own in a READ ONLY transaction with `statement_timeout` and `search_path` set to the
`sqlrag` schema alone; before it runs, its plan (EXPLAIN) must read nothing but the allowed tables (and the
documents table behind an allowed documents view), which is the run-time layer under the static guard,
as SQLite's authorizer is there.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import Any, NoReturn

import orjson
import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import InvalidParametersError, SqlRejectedError
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

SCHEMA = "sqlrag"
# The advisory lock class under which replace_table() takes a lock per table name (any fixed number).
_REPLACE_LOCK = 0x5351

# How each inferred type is declared: dates stay ISO 8601 text, so they compare and sort as dates.
SQL_TYPES: dict[ColumnType, str] = {
    "INTEGER": "BIGINT",
    "REAL": "DOUBLE PRECISION",
    "BOOLEAN": "BOOLEAN",
    "DATE": "TEXT",
    "DATETIME": "TEXT",
    "TEXT": "TEXT",
    "JSON": "TEXT",
}

_SELECT = (
    "SELECT name, kind, source_name, collection_id, columns, row_count, source, created_at, updated_at "
    "FROM structured_tables"
)


# Rows per FETCH from the server-side cursor, so a fetch never goes past the result size budget by more
# than one row (a round trip per row: about 40 ms for 1000 rows).
_FETCH_ROWS = 1


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _info(row: Sequence[Any]) -> TableInfo:
    return table_info(row, row[4])


def _metadata_value(key: str, kind: ColumnType) -> sql.Composable:
    """A metadata key as a view column of its type; a value of another JSON type reads as NULL.

    SQLite's json_extract gives every value its own type; Postgres columns have one, so a value that does
    not fit (a word where numbers were seen) is NULL rather than an error for the whole view.
    """
    value = sql.SQL("(metadata -> {})").format(sql.Literal(key))
    text = sql.SQL("(metadata ->> {})").format(sql.Literal(key))
    if kind == "INTEGER":
        return sql.SQL(
            "CASE WHEN jsonb_typeof({v}) = 'number' AND {t} ~ '^-?[0-9]+$' THEN {t}::bigint END"
        ).format(v=value, t=text)
    if kind == "REAL":
        return sql.SQL("CASE WHEN jsonb_typeof({v}) = 'number' THEN {t}::double precision END").format(
            v=value, t=text
        )
    if kind == "BOOLEAN":
        return sql.SQL("CASE WHEN jsonb_typeof({v}) = 'boolean' THEN {t}::boolean END").format(
            v=value, t=text
        )
    if kind == "JSON":
        return sql.SQL("{v}::text").format(v=value)
    return text


def _reject(reason: str) -> NoReturn:
    msg = f"SQL rejected: {reason}"
    raise SqlRejectedError(msg, {"reason": reason, "stage": "execution"})


def _cell(value: Any) -> Any:
    """A value as SQLite would hand it back: numbers as int or float, bytes as hex, dates as ISO text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | memoryview):
        return "0x" + bytes(value).hex()
    if isinstance(value, dt.date | dt.datetime | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return str(value)
    return value


def _relations(plan: Any) -> Iterator[tuple[str, str, str]]:
    """(node type, schema, relation or function name) of each scan in an EXPLAIN (JSON, VERBOSE) plan."""
    if isinstance(plan, list):
        for item in plan:
            yield from _relations(item)
    elif isinstance(plan, dict):
        if "Relation Name" in plan:
            yield plan.get("Node Type", ""), plan.get("Schema", ""), plan["Relation Name"]
        if "Function Name" in plan:
            yield "Function Scan", plan.get("Schema", ""), plan["Function Name"]
        for value in plan.values():
            if isinstance(value, list | dict):
                yield from _relations(value)


class PostgresStructuredTables:
    """StructuredTableStorage on the store's database."""

    dialect = "postgres"

    def __init__(self, store: PostgresStore) -> None:
        self.store = store

    def _rows(self, statement: str | sql.Composed, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.store.connection().cursor(row_factory=tuple_row) as cursor:
            return cursor.execute(statement, parameters).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """The store's transaction on this thread's connection: COMMIT, or ROLLBACK on any exception."""
        with self.store.transaction():
            yield

    # The registry
    def list_tables(self) -> list[TableInfo]:
        """Every registered table and view, tables first, by name."""
        return [_info(row) for row in self._rows(f"{_SELECT} ORDER BY kind DESC, name")]

    def get_table(self, name: str) -> TableInfo | None:
        """One registry entry by its SQL name (case-insensitive)."""
        rows = self._rows(f"{_SELECT} WHERE name = %s", (name.lower(),))
        return _info(rows[0]) if rows else None

    def view_for(self, collection_id: str) -> TableInfo | None:
        """The registered documents view of a collection, if it was built."""
        rows = self._rows(f"{_SELECT} WHERE kind = 'documents_view' AND collection_id = %s", (collection_id,))
        return _info(rows[0]) if rows else None

    def counts(self) -> dict[TableKind, int]:
        """How many tables and documents views are registered."""
        return {
            kind: int(n)
            for kind, n in self._rows("SELECT kind, COUNT(*) FROM structured_tables GROUP BY kind")
        }

    def object_names(self) -> list[str]:
        """Every table, view, index and sequence of the backend's schema and of `sqlrag`."""
        rows = self._rows(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname IN ('public', %s)",
            (SCHEMA,),
        )
        return [row[0] for row in rows]

    def _upsert(self, info: TableInfo) -> None:
        columns = [{"name": c.name, "source": c.source, "type": c.type} for c in info.columns]
        self.store.connection().execute(
            """INSERT INTO structured_tables VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, source_name = excluded.source_name,
                   collection_id = excluded.collection_id, columns = excluded.columns,
                   row_count = excluded.row_count, source = excluded.source,
                   created_at = excluded.created_at, updated_at = excluded.updated_at""",
            (
                info.name,
                info.kind,
                info.source_name,
                info.collection_id,
                Jsonb(columns),
                info.row_count,
                info.source,
                info.created_at,
                info.updated_at,
            ),
        )

    def _relkind(self, name: str) -> str | None:
        """What holds the name in the sqlrag schema (r table, v view...), or None."""
        rows = self._rows(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND lower(c.relname) = %s",
            (SCHEMA, name.lower()),
        )
        return str(rows[0][0]) if rows else None

    # Tables
    def replace_table(
        self, table: NewTable, may_replace: Callable[[TableInfo], None]
    ) -> tuple[TableInfo, TableInfo | None]:
        """DROP, CREATE, INSERT and register in one transaction (a failure leaves the old table)."""
        target = sql.Identifier(SCHEMA, table.name)
        definition = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(SQL_TYPES[c.type])) for c in table.columns
        )
        insert = sql.SQL("INSERT INTO {} VALUES ({})").format(
            target, sql.SQL(", ").join([sql.Placeholder()] * len(table.columns))
        )
        now = _now()
        with self.transaction():
            # Replaces of one name take turns: the entry read next is the one this DROP will replace.
            self.store.connection().execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_REPLACE_LOCK, table.name)
            )
            existing = self.get_table(table.name)
            other = self._relkind(table.name)
            if other is not None and (existing is None or existing.kind != "table"):
                what = {"r": "table", "v": "view", "i": "index", "S": "sequence"}.get(other, "relation")
                msg = (
                    f"a {what} named {table.name!r} exists and is not a structured table; choose another name"
                )
                raise InvalidParametersError(msg)
            if existing is not None:
                may_replace(existing)
            connection = self.store.connection()
            connection.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
            connection.execute(sql.SQL("CREATE TABLE {} ({})").format(target, definition))
            if table.rows:
                with connection.cursor() as cursor:
                    cursor.executemany(insert, table.rows)
            info = TableInfo(
                name=table.name,
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
        while self._relkind(name) is not None or self.get_table(name) is not None:
            name, n = fit_name(f"{base}_{n}"), n + 1
        return name

    def save_view(self, view: ViewSpec, *, rebuild: bool) -> TableInfo:
        """Register the view, recreated over the JSONB metadata when its columns or their types change."""
        existing = self.view_for(view.collection_id)
        name = existing.name if existing else self._free_view_name(view.base_name)
        columns = view.document_columns + view.metadata_columns
        # Unlike SQLite's json_extract, each column casts to its type: a widened type needs a new view.
        if rebuild or existing is None or existing.columns != columns:
            selects = [sql.Identifier(c.name) for c in view.document_columns] + [
                sql.SQL("{} AS {}").format(_metadata_value(c.source, c.type), sql.Identifier(c.name))
                for c in view.metadata_columns
            ]
            target = sql.Identifier(SCHEMA, name)
            connection = self.store.connection()
            connection.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(target))
            connection.execute(
                sql.SQL("CREATE VIEW {} AS SELECT {} FROM public.documents WHERE collection_id = {}").format(
                    target, sql.SQL(", ").join(selects), sql.Literal(view.collection_id)
                )
            )
        now = _now()
        info = TableInfo(
            name=name,
            kind="documents_view",
            source_name=view.collection_id,
            collection_id=view.collection_id,
            columns=columns,
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
            kind = sql.SQL("VIEW" if info.kind == "documents_view" else "TABLE")
            connection.execute(
                sql.SQL("DROP {} IF EXISTS {}").format(kind, sql.Identifier(SCHEMA, info.name))
            )
            connection.execute("DELETE FROM structured_tables WHERE name = %s", (info.name,))

    def document_count(self, collection_id: str) -> int:
        """Documents of the collection now."""
        return int(
            self._rows("SELECT COUNT(*) FROM documents WHERE collection_id = %s", (collection_id,))[0][0]
        )

    def document_metadata(self, collection_id: str) -> list[dict[str, Any]]:
        """Each document's metadata."""
        rows = self._rows("SELECT metadata FROM documents WHERE collection_id = %s", (collection_id,))
        return [row[0] if isinstance(row[0], dict) else orjson.loads(row[0]) for row in rows]

    def samples(self, table: TableInfo, limit: int) -> list[list[Any]]:
        """Distinct non-null values of each column: a table's in the order stored, a view's sorted."""
        target = sql.Identifier(SCHEMA, table.name)
        # A view has no physical row order (no ctid) to keep.
        order = sql.SQL("min(ctid)" if table.kind == "table" else "1")
        found = []
        for column in table.columns:
            name = sql.Identifier(column.name)
            statement = sql.SQL(
                "SELECT {c} FROM {t} WHERE {c} IS NOT NULL GROUP BY {c} ORDER BY {o} LIMIT %s"
            ).format(c=name, t=target, o=order)
            found.append([_cell(row[0]) for row in self._rows(statement, (limit,))])
        return found

    # Statements
    def run_select(self, checked: CheckedSql, limits: SelectLimits, gate: StatementGate) -> SqlResult:
        """Run the statement read-only, within its time limit, after its plan passed the table check."""
        check_cancelled()
        gate.acquire(limits.timeout_ms / 1000)
        started = time.monotonic()
        try:
            with self.store.separate_connection() as connection:
                connection.autocommit = False
                try:
                    columns, rows, truncated_by = self._run(connection, checked, limits)
                finally:
                    connection.rollback()
                    connection.autocommit = True
        finally:
            gate.release()
        elapsed = (time.monotonic() - started) * 1000
        return SqlResult(columns, rows, truncated_by, round(elapsed, 3))

    def _run(
        self, connection: psycopg.Connection[Any], checked: CheckedSql, limits: SelectLimits
    ) -> tuple[list[str], list[list[Any]], TruncatedBy | None]:
        with connection.cursor(row_factory=tuple_row) as cursor:
            cursor.execute("SET TRANSACTION READ ONLY")
            cursor.execute(
                sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(int(limits.timeout_ms)))
            )
            cursor.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(SCHEMA)))
            try:
                # Bytes, no parameters: the checked text goes as it is ('%' in a LIKE is no placeholder).
                cursor.execute(b"EXPLAIN (FORMAT JSON, VERBOSE) " + checked.executed_sql.encode())
                plan = cursor.fetchone()
                self._check_plan(plan[0] if plan else [], limits, set(checked.ctes))
                # A server-side cursor: rows cross over as they are read, so collect_rows stops the fetch
                # at the result size budget (a client cursor would receive the whole result at once).
                with connection.cursor(name="sqlrag_result", row_factory=tuple_row) as result:
                    result.itersize = _FETCH_ROWS
                    result.execute(checked.executed_sql.encode())
                    columns = [d.name for d in result.description or ()]
                    return columns, *collect_rows(result, _cell, checked, limits)
            except psycopg.errors.QueryCanceled:
                _reject(f"it ran past the {limits.timeout_ms} ms time limit and was stopped")
            except psycopg.errors.ReadOnlySqlTransaction:
                _reject("it tried to write; the transaction is read-only")
            except psycopg.Error as exc:
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                _reject(f"PostgreSQL error: {first}")

    @staticmethod
    def _check_plan(plan: Any, limits: SelectLimits, ctes: set[str]) -> None:
        """Each relation the plan scans is allowed: a structured table, or documents under an allowed view."""
        allowed = {name.lower() for name in limits.allowed}
        for node, schema, name in _relations(plan):
            if node == "Function Scan":
                _reject(f"not authorized: calling table function {name}()")
            if schema == SCHEMA and name.lower() in allowed:
                continue
            if schema == "public" and name == "documents" and limits.views:
                continue  # a documents view reads the documents table; the view itself was allowed
            if name.lower() in ctes and not schema:
                continue
            _reject(f"not authorized: reading table {name!r}")

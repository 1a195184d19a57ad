"""Structured tables: CSV or JSON lines stored as real SQLite tables with inferred column types.

Every queryable object is listed in the registry table `structured_tables`: ingested tables (`t_<name>`)
and one read-only view per collection (`documents_<collection>`) that exposes each document's id, title,
timestamps and top-level metadata keys as columns. Nothing that is not in the registry can be queried.
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

import orjson

from iris_rag.backends.sqlite.filters import json_path
from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.errors import InvalidParametersError
from iris_rag.stores.base import DocumentInput, DocumentStore

ColumnType = Literal["INTEGER", "REAL", "BOOLEAN", "DATE", "DATETIME", "TEXT", "JSON"]
TableKind = Literal["table", "documents_view"]

TABLE_PREFIX = "t_"
VIEW_PREFIX = "documents_"
REGISTRY_TABLE = "structured_tables"
TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
MAX_COLUMNS = 200
MAX_ROWS = 1_000_000
MAX_VIEW_COLUMNS = 100

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

_INTEGER = re.compile(r"^[+-]?(0|[1-9][0-9]*)$")
# No leading zeros: codes such as '02134' stay text.
_REAL = re.compile(r"^[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
_DATETIME = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?(Z|[+-][0-9]{2}:?[0-9]{2})?$"
)
_INT64 = 2**63
# A metadata key becomes a view column only if it can be written as a JSON path without escaping.
_VIEW_KEY = re.compile(r'^[^"\\\x00-\x1f]{1,64}$')
# Column names that would need quoting in every query are given a trailing underscore instead.
_RESERVED = frozenset(
    """abort action add after all alter analyze and as asc attach autoincrement before begin between by
    cascade case cast check collate column commit conflict constraint create cross current current_date
    current_time current_timestamp database default deferrable deferred delete desc detach distinct do drop
    each else end escape except exclusive exists explain fail filter for foreign from full glob group having
    if ignore immediate in index indexed initially inner insert instead intersect into is isnull join key
    left like limit match natural no not notnull null of offset on or order outer over partition plan
    pragma primary query raise range recursive references regexp reindex release rename replace restrict
    returning right rollback row rows savepoint select set table temp temporary then to transaction trigger
    union unique update using vacuum values view virtual when where window with without""".split()
)
_VIEW_BASE: tuple[tuple[str, ColumnType], ...] = (
    ("id", "TEXT"),
    ("title", "TEXT"),
    ("created_at", "DATETIME"),
    ("updated_at", "DATETIME"),
)


@dataclass(frozen=True, slots=True)
class Column:
    """A column of a structured table: its SQL name, where it came from, and its inferred type."""

    name: str
    source: str
    type: ColumnType

    def to_dict(self) -> dict[str, Any]:
        """The wire shape."""
        return {"name": self.name, "source_name": self.source, "type": self.type}


@dataclass(frozen=True, slots=True)
class TableInfo:
    """One registry row: a queryable table or documents view."""

    name: str
    kind: TableKind
    source_name: str
    collection_id: str | None
    columns: tuple[Column, ...]
    row_count: int
    source: str
    created_at: str
    updated_at: str


@dataclass(frozen=True, slots=True)
class RawTable:
    """Rows read from a source before typing: CSV cells are text, JSON cells keep their JSON types."""

    headers: list[str]
    rows: list[list[Any]]
    typed: bool


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# Type inference
def _classify_date(text: str) -> ColumnType | None:
    if _DATE.match(text):
        try:
            date.fromisoformat(text)
        except ValueError:
            return None
        return "DATE"
    if _DATETIME.match(text):
        try:
            datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return "DATETIME"
    return None


def classify(value: Any, *, typed: bool) -> ColumnType | None:
    """The narrowest type of a cell (None if empty): text is parsed, JSON values keep their JSON type."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        if typed:
            return _classify_date(text) or "TEXT"
        if _INTEGER.match(text):
            return "INTEGER" if -_INT64 <= int(text) < _INT64 else "TEXT"
        if _REAL.match(text):
            return "REAL"
        if text.lower() in ("true", "false"):
            return "BOOLEAN"
        return _classify_date(text) or "TEXT"
    if isinstance(value, bool):
        return "BOOLEAN"
    if isinstance(value, int):
        return "INTEGER" if -_INT64 <= value < _INT64 else "TEXT"
    if isinstance(value, float):
        return "REAL"
    if isinstance(value, list | dict):
        return "JSON"
    return "TEXT"


def merge_types(first: ColumnType | None, second: ColumnType | None) -> ColumnType | None:
    """The narrowest type holding both: INTEGER+REAL is REAL, DATE+DATETIME is DATETIME, else TEXT."""
    if first is None:
        return second
    if second is None or first == second:
        return first
    pair = {first, second}
    if pair == {"INTEGER", "REAL"}:
        return "REAL"
    if pair == {"DATE", "DATETIME"}:
        return "DATETIME"
    return "TEXT"


def infer_type(values: Iterable[Any], *, typed: bool) -> ColumnType:
    """The type of a column: every non-empty cell must fit it; a column of empty cells is TEXT."""
    found: ColumnType | None = None
    for value in values:
        found = merge_types(found, classify(value, typed=typed))
        if found == "TEXT":
            break
    return found or "TEXT"


def convert(value: Any, column_type: ColumnType) -> Any:
    """A cell as stored in a column of that type (empty cells are NULL, booleans 1/0, JSON as text)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        if column_type == "INTEGER":
            return int(text)
        if column_type == "REAL":
            return float(text)
        if column_type == "BOOLEAN":
            return int(text.lower() == "true")
        return text if column_type in ("DATE", "DATETIME") else value
    if column_type in ("INTEGER", "BOOLEAN"):
        return int(value)
    if column_type == "REAL":
        return float(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return orjson.dumps(value).decode()
    return str(value)


def column_name(source: str) -> str:
    """A plain SQL identifier for a source column name: lower case, words joined by '_'."""
    name = re.sub(r"\W+", "_", source.strip().lower()).strip("_") or "column"
    if name[0].isdigit():
        name = f"c_{name}"
    if name in _RESERVED:
        name = f"{name}_"
    return name[:60]


def unique_names(sources: Sequence[str], taken: Iterable[str] = ()) -> list[str]:
    """column_name() of each source, with _2, _3... where two would collide."""
    used = {name.lower() for name in taken}
    names = []
    for source in sources:
        base = column_name(source)
        name, n = base, 2
        while name.lower() in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name.lower())
        names.append(name)
    return names


# Reading sources
def _invalid(message: str, errors: list[str] | None = None) -> InvalidParametersError:
    return InvalidParametersError(message, {"errors": errors} if errors else None)


def parse_csv(text: str, *, delimiter: str | None = None) -> RawTable:
    """CSV with a header row; the delimiter (',', tab, ';' or '|') is the one the header uses most."""
    csv.field_size_limit(sys.maxsize)
    if delimiter is None:
        first_line = next((line for line in text.splitlines() if line.strip()), "")
        counts = {d: first_line.count(d) for d in (",", "\t", ";", "|")}
        delimiter = max(counts, key=lambda d: counts[d]) if any(counts.values()) else ","
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    headers: list[str] | None = None
    rows: list[list[Any]] = []
    errors: list[str] = []
    try:
        for record in reader:
            if not any(cell.strip() for cell in record):
                continue
            if headers is None:
                headers = [cell.strip() or f"column_{i + 1}" for i, cell in enumerate(record)]
                continue
            if len(record) > len(headers):
                errors.append(f"line {reader.line_num}: {len(record)} fields, the header has {len(headers)}")
                continue
            rows.append(record + [None] * (len(headers) - len(record)))
    except csv.Error as exc:
        errors.append(f"line {reader.line_num}: {exc}")
    if errors:
        msg = f"the CSV has {len(errors)} malformed rows (first: {errors[0]}); fix them and ingest again"
        raise _invalid(msg, errors[:10])
    if headers is None:
        msg = "the CSV is empty: expected a header row and at least one data row"
        raise _invalid(msg)
    return RawTable(headers, rows, typed=False)


def parse_records(records: Sequence[Any]) -> RawTable:
    """JSON objects → columns (the union of their keys, in first-seen order) and rows (missing keys NULL)."""
    headers: dict[str, None] = {}
    errors = []
    for position, record in enumerate(records):
        if not isinstance(record, Mapping):
            errors.append(f"record {position + 1}: expected a JSON object, got {type(record).__name__}")
            continue
        headers.update(dict.fromkeys(str(key) for key in record))
    if errors:
        msg = f"{len(errors)} records are not JSON objects (first: {errors[0]})"
        raise _invalid(msg, errors[:10])
    names = list(headers)
    rows = [[record.get(name) for name in names] for record in records]
    return RawTable(names, rows, typed=True)


def parse_json_lines(text: str) -> RawTable:
    """One JSON object per line (or one JSON array of objects)."""
    if text.lstrip().startswith("["):
        try:
            records = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            msg = f"invalid JSON array: {exc}"
            raise _invalid(msg) from exc
        return parse_records(records)
    records, errors = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            errors.append(f"line {number}: invalid JSON: {exc}")
            continue
        if not isinstance(record, dict):
            errors.append(f"line {number}: expected a JSON object, got {type(record).__name__}")
            continue
        records.append(record)
    if errors:
        msg = f"{len(errors)} lines are not JSON objects (first: {errors[0]}); fix them and ingest again"
        raise _invalid(msg, errors[:10])
    return parse_records(records)


def read_table_file(path: Path) -> RawTable:
    """A .csv/.tsv or .jsonl/.ndjson/.json file as a RawTable."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".jsonl", ".ndjson", ".json"):
        msg = f"unsupported table file {path.name!r}: use .csv, .tsv, .jsonl, .ndjson or .json"
        raise InvalidParametersError(msg)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        msg = f"{path.name} is not valid UTF-8 (byte {exc.start}); convert it to UTF-8"
        raise InvalidParametersError(msg) from exc
    except OSError as exc:
        msg = f"cannot read {path}: {exc.strerror}"
        raise InvalidParametersError(msg) from exc
    if suffix in (".csv", ".tsv"):
        return parse_csv(text, delimiter="\t" if suffix == ".tsv" else None)
    return parse_json_lines(text)


# The registry
def create_registry(connection: sqlite3.Connection) -> None:
    """Create the registry table if absent."""
    connection.execute(_REGISTRY_DDL)


def _info(row: Sequence[Any]) -> TableInfo:
    name, kind, source_name, collection_id, columns, row_count, source, created_at, updated_at = row
    return TableInfo(
        name=name,
        kind=kind,
        source_name=source_name,
        collection_id=collection_id,
        columns=tuple(Column(c["name"], c["source"], c["type"]) for c in orjson.loads(columns)),
        row_count=row_count,
        source=source,
        created_at=created_at,
        updated_at=updated_at,
    )


_SELECT = (
    "SELECT name, kind, source_name, collection_id, columns, row_count, source, created_at, updated_at "
    f"FROM {REGISTRY_TABLE}"
)


def list_tables(connection: sqlite3.Connection) -> list[TableInfo]:
    """Every registered table and view, tables first, by name."""
    rows = connection.execute(f"{_SELECT} ORDER BY kind DESC, name").fetchall()
    return [_info(row) for row in rows]


def get_table(connection: sqlite3.Connection, name: str) -> TableInfo | None:
    """One registry entry by its SQL name (case-insensitive)."""
    row = connection.execute(f"{_SELECT} WHERE name = ?", (name.lower(),)).fetchone()
    return _info(row) if row else None


def _upsert(connection: sqlite3.Connection, info: TableInfo) -> None:
    columns = orjson.dumps([{"name": c.name, "source": c.source, "type": c.type} for c in info.columns])
    connection.execute(
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


def quote(identifier: str) -> str:
    """An SQL identifier in double quotes."""
    return '"' + identifier.replace('"', '""') + '"'


def table_sql_name(table: str) -> str:
    """t_<name> for a valid table name (a letter, then letters, digits or '_'; at most 48)."""
    if not TABLE_NAME.match(table):
        msg = f"table name {table!r} must start with a letter and hold only letters, digits and '_' (max 48)"
        raise InvalidParametersError(msg)
    return TABLE_PREFIX + table.lower()


# Ingesting a table
def build_table(raw: RawTable) -> tuple[tuple[Column, ...], list[list[Any]]]:
    """Infer each column's type and convert every cell to it."""
    if not raw.headers:
        msg = "the table has no columns"
        raise InvalidParametersError(msg)
    if len(raw.headers) > MAX_COLUMNS:
        msg = f"the table has {len(raw.headers)} columns; at most {MAX_COLUMNS} are supported"
        raise InvalidParametersError(msg)
    if not raw.rows:
        msg = "the table has a header but no rows"
        raise InvalidParametersError(msg)
    if len(raw.rows) > MAX_ROWS:
        msg = f"the table has {len(raw.rows)} rows; at most {MAX_ROWS} are supported"
        raise InvalidParametersError(msg)
    names = unique_names(raw.headers)
    columns = tuple(
        Column(name, source, infer_type((row[i] for row in raw.rows), typed=raw.typed))
        for i, (name, source) in enumerate(zip(names, raw.headers, strict=True))
    )
    rows = [[convert(row[i], column.type) for i, column in enumerate(columns)] for row in raw.rows]
    return columns, rows


def ingest_table(
    connection: sqlite3.Connection,
    table: str,
    raw: RawTable,
    *,
    collection_id: str | None,
    source: str,
) -> dict[str, Any]:
    """Create or replace t_<table> with the rows, and register it, in one transaction."""
    sql_name = table_sql_name(table)
    columns, rows = build_table(raw)
    definition = ", ".join(f"{quote(c.name)} {SQL_TYPES[c.type]}" for c in columns)
    placeholders = ", ".join("?" * len(columns))
    now = _now()
    connection.execute("BEGIN IMMEDIATE")
    try:
        existing = get_table(connection, sql_name)
        other = connection.execute(
            "SELECT type FROM sqlite_master WHERE lower(name) = ?", (sql_name,)
        ).fetchone()
        if other is not None and existing is None:
            msg = f"a {other[0]} named {sql_name!r} exists and is not a structured table; choose another name"
            raise InvalidParametersError(msg)
        connection.execute(f"DROP TABLE IF EXISTS {quote(sql_name)}")
        connection.execute(f"CREATE TABLE {quote(sql_name)} ({definition})")
        connection.executemany(f"INSERT INTO {quote(sql_name)} VALUES ({placeholders})", rows)
        info = TableInfo(
            name=sql_name,
            kind="table",
            source_name=table.lower(),
            collection_id=collection_id,
            columns=columns,
            row_count=len(rows),
            source=source,
            created_at=existing.created_at if existing else now,
            updated_at=now,
        )
        _upsert(connection, info)
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return {
        "table": info.source_name,
        "sql_name": sql_name,
        "collection_id": collection_id,
        "row_count": len(rows),
        "columns": [c.to_dict() for c in columns],
        "replaced": existing is not None,
    }


# Documents views
def metadata_types(metadatas: Iterable[Mapping[str, Any]]) -> dict[str, ColumnType | None]:
    """Each top-level metadata key that can be a view column, with the type of its values."""
    types: dict[str, ColumnType | None] = {}
    for metadata in metadatas:
        for key, value in metadata.items():
            if _VIEW_KEY.match(key):
                types[key] = merge_types(types.get(key), classify(value, typed=True))
    return types


def _view_name(connection: sqlite3.Connection, collection_id: str) -> str:
    base = VIEW_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", collection_id).lower()
    name, n = base, 2
    # Two collection ids can map to one name ('a-b', 'a_b'): the later one gets a suffix.
    while connection.execute("SELECT 1 FROM sqlite_master WHERE lower(name) = ?", (name,)).fetchone():
        name, n = f"{base}_{n}", n + 1
    return name


def view_for(connection: sqlite3.Connection, collection_id: str) -> TableInfo | None:
    """The registered documents view of a collection, if it was built."""
    row = connection.execute(
        f"{_SELECT} WHERE kind = 'documents_view' AND collection_id = ?", (collection_id,)
    ).fetchone()
    return _info(row) if row else None


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def refresh_view(
    connection: sqlite3.Connection, collection_id: str, key_types: Mapping[str, ColumnType | None]
) -> TableInfo:
    """Add new metadata keys to the collection's view (recreating it) and update column types.

    Runs inside the caller's transaction.
    """
    existing = view_for(connection, collection_id)
    base = [Column(name, name, kind) for name, kind in _VIEW_BASE]
    metadata_columns = list(existing.columns[len(base) :]) if existing else []
    by_source = {c.source: i for i, c in enumerate(metadata_columns)}
    changed = existing is None
    for key, kind in key_types.items():
        if key in by_source:
            i = by_source[key]
            merged = merge_types(metadata_columns[i].type, kind) or "TEXT"
            metadata_columns[i] = Column(metadata_columns[i].name, key, merged)
        elif len(metadata_columns) < MAX_VIEW_COLUMNS:
            taken = [c.name for c in base + metadata_columns]
            metadata_columns.append(Column(unique_names([key], taken)[0], key, kind or "TEXT"))
            by_source[key] = len(metadata_columns) - 1
            changed = True
    name = existing.name if existing else _view_name(connection, collection_id)
    if changed:
        selects = [quote(c.name) for c in base] + [
            f"json_extract(metadata, {_sql_text(json_path(c.source))}) AS {quote(c.name)}"
            for c in metadata_columns
        ]
        connection.execute(f"DROP VIEW IF EXISTS {quote(name)}")
        connection.execute(
            f"CREATE VIEW {quote(name)} AS SELECT {', '.join(selects)} FROM documents "
            f"WHERE collection_id = {_sql_text(collection_id)}"
        )
    count = connection.execute(
        "SELECT COUNT(*) FROM documents WHERE collection_id = ?", (collection_id,)
    ).fetchone()[0]
    now = _now()
    info = TableInfo(
        name=name,
        kind="documents_view",
        source_name=collection_id,
        collection_id=collection_id,
        columns=tuple(base + metadata_columns),
        row_count=int(count),
        source=f"documents of collection {collection_id}",
        created_at=existing.created_at if existing else now,
        updated_at=now,
    )
    _upsert(connection, info)
    return info


def ensure_view(connection: sqlite3.Connection, collection_id: str) -> TableInfo:
    """The collection's view, built from its stored documents if it was ingested before the view existed."""
    info = view_for(connection, collection_id)
    if info is not None:
        return info
    connection.execute("BEGIN IMMEDIATE")
    try:
        info = view_for(connection, collection_id)
        if info is None:
            rows = connection.execute(
                "SELECT metadata FROM documents WHERE collection_id = ?", (collection_id,)
            ).fetchall()
            info = refresh_view(connection, collection_id, metadata_types(orjson.loads(r[0]) for r in rows))
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    return info


class DocumentViews:
    """The technique index of rag_sqlrag: each collection's documents view, refreshed inside every ingest."""

    name = "sqlrag_documents_views"

    def __init__(self, store: DocumentStore) -> None:
        self.store = store

    def create_tables(self) -> None:
        """Create the registry of structured tables."""
        connection = sqlite_connection(self.store)
        create_registry(connection)

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> dict[str, ColumnType | None]:
        """The metadata keys of the incoming documents and their value types."""
        return metadata_types(d.metadata for d in documents)

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Add columns for new keys to the view (it reads the documents table itself: no rows to copy)."""
        connection = sqlite_connection(self.store)
        refresh_view(connection, collection_id, prepared)

    def delete(self, collection_id: str, document_id: str) -> None:
        """Nothing: a deleted document leaves the view with its row."""
        sqlite_connection(self.store)

    def stats(self) -> dict[str, Any]:
        """How many tables and documents views are registered."""
        connection = sqlite_connection(self.store)
        rows = connection.execute(f"SELECT kind, COUNT(*) FROM {REGISTRY_TABLE} GROUP BY kind").fetchall()
        counts = {kind: count for kind, count in rows}
        return {"tables": counts.get("table", 0), "documents_views": counts.get("documents_view", 0)}

    def indexed_documents(self, collection_id: str) -> int:
        """Every document: the view reads the documents table, and a missing view is built on first use.

        So a collection ingested before rag_sqlrag existed never needs a reindex for it (ensure_view).
        """
        connection = sqlite_connection(self.store)
        row = connection.execute(
            "SELECT COUNT(*) FROM documents WHERE collection_id = ?", (collection_id,)
        ).fetchone()
        return int(row[0])

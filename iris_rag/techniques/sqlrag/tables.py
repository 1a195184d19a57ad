"""Structured tables: CSV or JSON lines stored as real tables with inferred column types.

Every queryable object is registered by the store (StructuredTableStorage): ingested tables (`t_<name>`)
and one read-only view per collection (`documents_<collection>`) that exposes each document's id, title,
timestamps and top-level metadata keys as columns. Nothing that is not registered can be queried. This
module decides types, names and columns; the backend stores them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

import orjson

from iris_rag import access
from iris_rag.errors import ForbiddenError, InvalidParametersError
from iris_rag.stores.base import DocumentInput, DocumentStore
from iris_rag.techniques.sqlrag.storage import (
    Column,
    ColumnType,
    NewTable,
    StructuredTableStorage,
    TableInfo,
    ViewSpec,
    fit_name,
)
from iris_rag.text import CsvProblem, csv_delimiter, csv_records, without_nul

TABLE_PREFIX = "t_"
VIEW_PREFIX = "documents_"
TABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
MAX_COLUMNS = 200
MAX_ROWS = 1_000_000
MAX_VIEW_COLUMNS = 100

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
class RawTable:
    """Rows read from a source before typing: CSV cells are text, JSON cells keep their JSON types."""

    headers: list[str]
    rows: list[list[Any]]
    typed: bool


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
    """A cell as stored in a column of that type (empty cells are NULL, booleans 1/0, JSON as text).

    A NUL character is dropped, as at ingest: PostgreSQL's text cannot hold one.
    """
    value = without_nul(value)
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
    """column_name() of each source, with _2, _3... where two would collide, each fitted (fit_name)."""
    used = {name.lower() for name in taken}
    names = []
    for source in sources:
        base = column_name(source)
        name, n = fit_name(base), 2
        while name.lower() in used:
            name, n = fit_name(f"{base}_{n}"), n + 1
        used.add(name.lower())
        names.append(name)
    return names


# Reading sources
def _invalid(message: str, errors: list[str] | None = None) -> InvalidParametersError:
    return InvalidParametersError(message, {"errors": errors} if errors else None)


def parse_csv(text: str, *, delimiter: str | None = None) -> RawTable:
    """CSV with a header row; the delimiter (',', tab, ';' or '|') is the one the header uses most."""
    if delimiter is None:
        delimiter = csv_delimiter(text)
    headers: list[str] | None = None
    rows: list[list[Any]] = []
    errors: list[str] = []
    try:
        for line, record in csv_records(text, delimiter):
            if not any(cell.strip() for cell in record):
                continue
            if headers is None:
                headers = [cell.strip() or f"column_{i + 1}" for i, cell in enumerate(record)]
                continue
            if len(record) > len(headers):
                errors.append(f"line {line}: {len(record)} fields, the header has {len(headers)}")
                continue
            rows.append(record + [None] * (len(headers) - len(record)))
    except CsvProblem as problem:
        errors.append(str(problem))
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


# Ingesting a table
def table_sql_name(table: str) -> str:
    """t_<name> for a valid table name (a letter, then letters, digits or '_'; at most 48)."""
    if not TABLE_NAME.match(table):
        msg = f"table name {table!r} must start with a letter and hold only letters, digits and '_' (max 48)"
        raise InvalidParametersError(msg)
    return TABLE_PREFIX + table.lower()


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
    raw = replace(raw, headers=without_nul(raw.headers))
    names = unique_names(raw.headers)
    columns = tuple(
        Column(name, source, infer_type((row[i] for row in raw.rows), typed=raw.typed))
        for i, (name, source) in enumerate(zip(names, raw.headers, strict=True))
    )
    rows = [[convert(row[i], column.type) for i, column in enumerate(columns)] for row in raw.rows]
    return columns, rows


def check_replace(existing: TableInfo, collection_id: str | None) -> None:
    """Refuse to replace a table the caller may not write, or under another collection than its own.

    Table names are one namespace for the whole store. A table of a collection the caller cannot see is
    refused without a word about it beyond the name being taken (which creating it would tell anyway); a
    shared table needs a key granted every collection; and a table is replaced only under its own
    collection_id, since another one would silently take it from its collection's statements (or show it
    to every collection). The caller's right to write `collection_id` itself is checked before this.
    """
    owner, name = existing.collection_id, existing.source_name
    if owner is not None and not access.can_see(owner):
        msg = f"the table name {name!r} is taken by a table this key may not write; choose another name"
        raise ForbiddenError(msg, {"table": name})
    if owner is None and not access.sees_everything():
        msg = (
            f"table {name!r} is shared by every collection: only a key granted every collection may "
            "replace it; choose another name"
        )
        raise ForbiddenError(msg, {"table": name})
    if owner != collection_id:
        where = f"belongs to collection {owner!r}" if owner else "is shared by every collection"
        again = f"collection_id {owner!r}" if owner else "no collection_id"
        msg = f"table {name!r} {where}; ingest it with {again} to replace it, or choose another name"
        raise InvalidParametersError(msg, {"table": name, "collection_id": owner})


def ingest_table(
    storage: StructuredTableStorage,
    table: str,
    raw: RawTable,
    *,
    collection_id: str | None,
    source: str,
    create_collection: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """Create or replace t_<table> with the rows, and register it, in one transaction.

    `create_collection`: makes the table's collection, new on this call, in that same transaction, so a
    refused or failed table leaves no empty collection behind (as a first rag_ingest).
    """
    sql_name = table_sql_name(table)
    columns, rows = build_table(raw)
    new = NewTable(sql_name, table.lower(), collection_id, columns, rows, source)
    with storage.transaction():
        if create_collection is not None:
            create_collection()
        info, replaced = storage.replace_table(new, lambda existing: check_replace(existing, collection_id))
    return {
        "table": info.source_name,
        "sql_name": sql_name,
        "collection_id": collection_id,
        "row_count": len(rows),
        "columns": [c.to_dict() for c in columns],
        "replaced": replaced is not None,
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


def view_columns(
    existing: TableInfo | None, key_types: Mapping[str, ColumnType | None]
) -> tuple[tuple[Column, ...], bool]:
    """The view's metadata columns after these keys (new keys added, types widened) and if they changed.

    A change of the column set means the view must be recreated.
    """
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
    return tuple(metadata_columns), changed


def refresh_view(
    storage: StructuredTableStorage, collection_id: str, key_types: Mapping[str, ColumnType | None]
) -> TableInfo:
    """Add new metadata keys to the collection's view (recreating it) and update column types.

    Runs inside the caller's transaction.
    """
    metadata_columns, changed = view_columns(storage.view_for(collection_id), key_types)
    view = ViewSpec(
        collection_id=collection_id,
        base_name=VIEW_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", collection_id).lower(),
        document_columns=tuple(Column(name, name, kind) for name, kind in _VIEW_BASE),
        metadata_columns=metadata_columns,
        source=f"documents of collection {collection_id}",
    )
    return storage.save_view(view, rebuild=changed)


def ensure_view(storage: StructuredTableStorage, collection_id: str) -> TableInfo:
    """The collection's view, built from its stored documents if it was ingested before the view existed."""
    info = storage.view_for(collection_id)
    if info is not None:
        return info
    with storage.transaction():
        info = storage.view_for(collection_id)
        if info is None:
            key_types = metadata_types(storage.document_metadata(collection_id))
            info = refresh_view(storage, collection_id, key_types)
    return info


class DocumentViews:
    """The technique index of rag_sqlrag: each collection's documents view, refreshed inside every ingest."""

    name = "sqlrag_documents_views"

    def __init__(self, store: DocumentStore) -> None:
        # Getting the storage creates the registry, so it exists before the first ingest writes to it.
        # A Protocol is abstract to mypy, yet it is exactly the key the backend's table is looked up by.
        self.storage = store.technique_storage(StructuredTableStorage)

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> dict[str, ColumnType | None]:
        """The metadata keys of the incoming documents and their value types."""
        return metadata_types(d.metadata for d in documents)

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Add columns for new keys to the view (it reads the documents themselves: no rows to copy)."""
        refresh_view(self.storage, collection_id, prepared)

    def delete(self, collection_id: str, document_id: str) -> None:
        """Nothing: a deleted document leaves the view with its row."""

    def stats(self) -> dict[str, Any]:
        """How many tables and documents views are registered."""
        counts = self.storage.counts()
        return {"tables": counts.get("table", 0), "documents_views": counts.get("documents_view", 0)}

    def drop_collection(self, collection_id: str) -> None:
        """The collection is going: its view and its structured tables go too (CollectionState)."""
        self.storage.drop_collection(collection_id)

    def indexed_documents(self, collection_id: str) -> int:
        """Every document: the view reads the documents, and a missing view is built on first use.

        So a collection ingested before rag_sqlrag existed never needs a reindex for it (ensure_view).
        """
        return self.storage.document_count(collection_id)

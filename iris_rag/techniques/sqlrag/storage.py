"""The storage contract of rag_sqlrag: structured tables, documents views and read-only statements.

What the technique decides (column types, names, the guard's policy) stays in the technique; each backend
implements this contract (backends/<backend>/sqlrag.py): how a table or view is stored, described and how a
checked SELECT runs read-only within its limits. Table names are the registry's SQL names (t_<name>,
documents_<collection>), each at most MAX_NAME_BYTES long (fit_name).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from iris_rag.errors import SqlRejectedError

# PostgreSQL's identifier limit (NAMEDATALEN - 1), the smallest of the stores': a longer name is cut there
# silently, and two names that agree up to it would be one table, view or column.
MAX_NAME_BYTES = 63
NAME_HASH_CHARS = 8


def fit_name(name: str) -> str:
    """The name itself if it fits MAX_NAME_BYTES, else its start, '_' and a hash of the whole name."""
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH_CHARS]
    start = name.encode()[: MAX_NAME_BYTES - NAME_HASH_CHARS - 1].decode(errors="ignore")
    return f"{start}_{digest}"


ColumnType = Literal["INTEGER", "REAL", "BOOLEAN", "DATE", "DATETIME", "TEXT", "JSON"]
TableKind = Literal["table", "documents_view"]
# Why a result holds fewer rows than the statement matched: max_rows, or the result's size budget.
TruncatedBy = Literal["max_rows", "max_result_bytes"]


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
class NewTable:
    """A typed table to store under `name`, replacing the structured table of that name if any."""

    name: str
    source_name: str
    collection_id: str | None
    columns: tuple[Column, ...]
    rows: list[list[Any]]  # cells already converted to their column's type
    source: str


@dataclass(frozen=True, slots=True)
class ViewSpec:
    """A collection's documents view: one row per document, with these columns."""

    collection_id: str
    # documents_<collection>, not yet fitted: a name already taken gets _2, _3... (new views only), then
    # fit_name() is applied to each candidate.
    base_name: str
    document_columns: tuple[Column, ...]  # the documents' own fields: id, title, created_at, updated_at
    metadata_columns: tuple[Column, ...]  # top-level metadata keys (Column.source), read from the JSON
    source: str


@dataclass(frozen=True, slots=True)
class CheckedSql:
    """A statement that passed the guard, as given and as it will run."""

    sql: str
    executed_sql: str
    tables: tuple[str, ...]
    ctes: tuple[str, ...]
    complexity: dict[str, Any]
    query_limit: int | None
    row_limit: int
    fetch_limit: int


@dataclass(frozen=True, slots=True)
class SelectLimits:
    """What a checked statement may do while it runs (the run-time layer, apart from the static check)."""

    allowed: frozenset[str]  # tables and views it may read (lower case)
    views: frozenset[str]  # those of them that are documents views (they read the documents rows)
    functions: frozenset[str]  # functions it may call
    allow_recursive: bool
    timeout_ms: int
    max_value_bytes: int
    max_result_bytes: int  # all rows together, as JSON (collect_rows)
    max_pattern_chars: int
    max_sql_chars: int


@dataclass(frozen=True, slots=True)
class SqlResult:
    """The rows a checked statement returned."""

    columns: list[str]
    rows: list[list[Any]]
    truncated_by: TruncatedBy | None
    execution_ms: float
    denied: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """Whether more rows matched than came back."""
        return self.truncated_by is not None


def collect_rows(
    fetched: Iterable[Sequence[Any]], cell: Callable[[Any], Any], checked: CheckedSql, limits: SelectLimits
) -> tuple[list[list[Any]], TruncatedBy | None]:
    """Take rows one at a time (cells converted by `cell`) up to the row limit and limits.max_result_bytes.

    `fetched` must fetch lazily: fetching stops at the first row past either limit, so the worker holds
    at most the budget and that one row (its values bounded by max_value_bytes). A row is measured as the
    JSON it becomes in the answer. If not even the first row fits, the statement is refused: an empty
    result would read as "nothing matched".
    """
    rows: list[list[Any]] = []
    size = 0
    for row in fetched:
        if len(rows) == checked.row_limit:
            return rows, "max_rows"  # the extra row fetch_limit asks for: more rows matched
        converted = [cell(value) for value in row]
        size += len(orjson.dumps(converted, default=str))
        if size > limits.max_result_bytes:
            if not rows:
                reason = (
                    f"its first row alone is past the result size limit of {limits.max_result_bytes} bytes; "
                    "select fewer or shorter columns (substr(), length())"
                )
                msg = f"SQL rejected: {reason}"
                raise SqlRejectedError(msg, {"reason": reason, "stage": "execution"})
            return rows, "max_result_bytes"
        rows.append(converted)
    return rows, None


class StatementGate(Protocol):
    """Caps how many statements run at once; a slot is held until the statement really ends."""

    def acquire(self, timeout_s: float) -> None:
        """Take a slot (SQL_REJECTED if none frees up within timeout_s)."""

    def release(self) -> None:
        """Give the slot back."""


class StructuredTableStorage(Protocol):
    """Structured tables and documents views of one store, and read-only SELECTs over them.

    save_view() runs in the caller's transaction (the ingest's, or transaction()); replace_table() runs in
    a transaction of its own, or in the caller's transaction(). Registry reads see the calling thread's open
    transaction.
    """

    dialect: str  # the sqlglot dialect statements are parsed and rendered in

    def transaction(self) -> AbstractContextManager[None]:
        """A write transaction: committed on exit, rolled back on an exception; it joins one already open."""

    def list_tables(self) -> list[TableInfo]:
        """Every registered table and view, tables first, by name."""

    def get_table(self, name: str) -> TableInfo | None:
        """One registry entry by its SQL name (case-insensitive)."""

    def view_for(self, collection_id: str) -> TableInfo | None:
        """The registered documents view of a collection, if it was built."""

    def counts(self) -> dict[TableKind, int]:
        """How many tables and documents views are registered, by kind."""

    def object_names(self) -> list[str]:
        """Every name in the database (tables, views, indexes...), so a statement's CTE cannot shadow one."""

    def replace_table(
        self, table: NewTable, may_replace: Callable[[TableInfo], None]
    ) -> tuple[TableInfo, TableInfo | None]:
        """Create or replace the table with its rows and register it, in one transaction.

        Returns the new registry entry and the one it replaced (None if new). InvalidParametersError if the
        name is taken by something that is not a structured table. A structured table of that name is first
        handed to `may_replace`, inside the transaction and after any concurrent replace of the name ended;
        an exception from it refuses the replace and changes nothing.
        """

    def save_view(self, view: ViewSpec, *, rebuild: bool) -> TableInfo:
        """Register the collection's view with its current document count; (re)create it when rebuild."""

    def drop_collection(self, collection_id: str) -> None:
        """Drop the collection's documents view and structured tables and their registry entries."""

    def document_count(self, collection_id: str) -> int:
        """How many documents the collection holds now."""

    def document_metadata(self, collection_id: str) -> list[dict[str, Any]]:
        """The metadata of every document of the collection."""

    def samples(self, table: TableInfo, limit: int) -> list[list[Any]]:
        """Up to `limit` distinct non-null values of each column, in column order."""

    def run_select(self, checked: CheckedSql, limits: SelectLimits, gate: StatementGate) -> SqlResult:
        """Run a checked statement read-only within the limits (SQL_REJECTED at stage 'execution')."""


# The registry's columns, in this order in every backend.
REGISTRY_COLUMNS = (
    "name",
    "kind",
    "source_name",
    "collection_id",
    "columns",
    "row_count",
    "source",
    "created_at",
    "updated_at",
)


def table_info(row: Sequence[Any], columns: list[dict[str, str]]) -> TableInfo:
    """A registry row (REGISTRY_COLUMNS) as a TableInfo; `columns` is its decoded column list."""
    name, kind, source_name, collection_id, _, row_count, source, created_at, updated_at = row
    return TableInfo(
        name=name,
        kind=kind,
        source_name=source_name,
        collection_id=collection_id,
        columns=tuple(Column(c["name"], c["source"], c["type"]) for c in columns),  # type: ignore[arg-type]
        row_count=int(row_count),
        source=source,
        created_at=created_at,
        updated_at=updated_at,
    )

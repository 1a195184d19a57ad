"""What a caller (or the LLM writing SQL) is told about the tables: columns, types, samples, rules."""

from __future__ import annotations

from typing import Any

from iris_rag.techniques.sqlrag.safety import COMPLEXITY, MAX_PATTERN_CHARS, MAX_SQL_CHARS, SAFE_FUNCTIONS
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage, TableInfo

SAMPLE_CHARS = 60


def _sample(value: Any) -> Any:
    if isinstance(value, bytes):
        value = "0x" + value.hex()
    if isinstance(value, str) and len(value) > SAMPLE_CHARS:
        return value[: SAMPLE_CHARS - 1] + "…"
    return value


def row_count(storage: StructuredTableStorage, info: TableInfo) -> int:
    """Rows now: stored at ingest for a table, counted for a documents view (its collection changes)."""
    if info.kind == "table" or info.collection_id is None:
        return info.row_count
    return storage.document_count(info.collection_id)


def describe_table(storage: StructuredTableStorage, info: TableInfo, sample_values: int) -> dict[str, Any]:
    """One table with its columns, their types and up to sample_values distinct non-null values each."""
    samples = storage.samples(info, sample_values) if sample_values > 0 else [[] for _ in info.columns]
    columns = [
        {**column.to_dict(), "samples": [_sample(value) for value in values]}
        for column, values in zip(info.columns, samples, strict=True)
    ]
    return {
        "name": info.name,
        "kind": info.kind,
        "source_name": info.source_name,
        "collection_id": info.collection_id,
        "row_count": row_count(storage, info),
        "source": info.source,
        "updated_at": info.updated_at,
        "columns": columns,
    }


def describe_tables(
    storage: StructuredTableStorage, tables: list[TableInfo], sample_values: int = 3
) -> list[dict[str, Any]]:
    """describe_table() for each table, in order."""
    return [describe_table(storage, info, sample_values) for info in tables]


def query_rules(dialect: str) -> dict[str, Any]:
    """The rules every statement must follow, whatever wrote it, in the store's dialect."""
    return {
        "dialect": dialect,
        "statement": "exactly one SELECT (UNION/INTERSECT/EXCEPT of SELECTs and WITH ... SELECT allowed)",
        "tables": "only the tables listed here, by their name (t_<table> or documents_<collection>)",
        "complexity": {level: limits.describe() for level, limits in COMPLEXITY.items()},
        "row_limit": "LIMIT is set to the smaller of the statement's own LIMIT and max_rows",
        "max_sql_chars": MAX_SQL_CHARS,
        "max_like_pattern_chars": MAX_PATTERN_CHARS,
        "functions": sorted(SAFE_FUNCTIONS),
        "not_allowed": (
            "writes, DDL, PRAGMA, ATTACH, bind parameters, table-valued functions, file or extension calls"
        ),
    }


def schema_text(described: list[dict[str, Any]]) -> str:
    """The described tables as compact text for an LLM prompt."""
    blocks = []
    for table in described:
        what = (
            f"one row per document of collection {table['collection_id']}"
            if table["kind"] == "documents_view"
            else f"ingested from {table['source']}"
        )
        lines = [f"{table['name']} ({table['row_count']} rows; {what})"]
        for column in table["columns"]:
            samples = ", ".join(repr(v) for v in column["samples"])
            lines.append(f"  {column['name']} {column['type']}" + (f"  e.g. {samples}" if samples else ""))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) or "(no tables)"

"""What a caller (or the LLM writing SQL) is told about the tables: columns, types, samples, rules."""

from __future__ import annotations

import sqlite3
from typing import Any

from iris_rag.techniques.sqlrag.safety import COMPLEXITY, MAX_PATTERN_CHARS, MAX_SQL_CHARS, SAFE_FUNCTIONS
from iris_rag.techniques.sqlrag.tables import TableInfo, quote

SAMPLE_CHARS = 60


def _sample(value: Any) -> Any:
    if isinstance(value, bytes):
        value = "0x" + value.hex()
    if isinstance(value, str) and len(value) > SAMPLE_CHARS:
        return value[: SAMPLE_CHARS - 1] + "…"
    return value


def row_count(connection: sqlite3.Connection, info: TableInfo) -> int:
    """Rows now: stored at ingest for a table, counted for a documents view (its collection changes)."""
    if info.kind == "table":
        return info.row_count
    row = connection.execute(
        "SELECT COUNT(*) FROM documents WHERE collection_id = ?", (info.collection_id,)
    ).fetchone()
    return int(row[0])


def describe_table(connection: sqlite3.Connection, info: TableInfo, sample_values: int) -> dict[str, Any]:
    """One table with its columns, their types and up to sample_values distinct non-null values each."""
    columns = []
    for column in info.columns:
        samples: list[Any] = []
        if sample_values > 0:
            rows = connection.execute(
                f"SELECT DISTINCT {quote(column.name)} FROM {quote(info.name)} "
                f"WHERE {quote(column.name)} IS NOT NULL LIMIT ?",
                (sample_values,),
            ).fetchall()
            samples = [_sample(row[0]) for row in rows]
        columns.append({**column.to_dict(), "samples": samples})
    return {
        "name": info.name,
        "kind": info.kind,
        "source_name": info.source_name,
        "collection_id": info.collection_id,
        "row_count": row_count(connection, info),
        "source": info.source,
        "updated_at": info.updated_at,
        "columns": columns,
    }


def describe_tables(
    connection: sqlite3.Connection, tables: list[TableInfo], sample_values: int = 3
) -> list[dict[str, Any]]:
    """describe_table() for each table, in order."""
    return [describe_table(connection, info, sample_values) for info in tables]


def query_rules() -> dict[str, Any]:
    """The rules every statement must follow, whatever wrote it."""
    return {
        "dialect": "sqlite",
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

"""Metadata filters compiled to SQLite: json_extract over the documents' JSON metadata column."""

from __future__ import annotations

from typing import Any

from iris_rag.stores.filters import MetadataFilter

_SQL = {"eq": "=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def json_path(field: str) -> str:
    """The SQLite JSON path of a top-level metadata key (quoted, so dots stay part of the name)."""
    return f'$."{field}"'


def to_sql(metadata_filter: MetadataFilter, column: str = "d.metadata") -> tuple[str, list[Any]]:
    """A WHERE fragment (AND of every condition) over a JSON metadata column, with its parameters."""
    clauses: list[str] = []
    parameters: list[Any] = []
    for condition in metadata_filter.conditions:
        extract = f"json_extract({column}, ?)"
        parameters.append(json_path(condition.field))
        if condition.operator == "in":
            clauses.append(f"{extract} IN ({','.join('?' * len(condition.value))})")
            parameters.extend(_sql_value(v) for v in condition.value)
        else:
            clauses.append(f"{extract} {_SQL[condition.operator]} ?")
            parameters.append(_sql_value(condition.value))
    return " AND ".join(clauses), parameters


def _sql_value(value: Any) -> Any:
    # json_extract gives JSON true/false as 1/0.
    return int(value) if isinstance(value, bool) else value

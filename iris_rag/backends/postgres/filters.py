"""Metadata filters compiled to PostgreSQL: JSONB operators over the documents' metadata column."""

from __future__ import annotations

from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from iris_rag.stores.filters import Condition, MetadataFilter

_COMPARE = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def to_sql(
    metadata_filter: MetadataFilter | None, column: str = "d.metadata"
) -> tuple[sql.Composable, dict[str, Any]]:
    """A WHERE fragment (AND of every condition; TRUE for no filter) and its named parameters (f0, f1...)."""
    if metadata_filter is None or not metadata_filter.conditions:
        return sql.SQL("TRUE"), {}
    parameters: dict[str, Any] = {}

    def bind(value: Any) -> sql.Composable:
        name = f"f{len(parameters)}"
        parameters[name] = value
        return sql.Placeholder(name)

    target = sql.SQL(column)
    clauses = [_condition(target, condition, bind) for condition in metadata_filter.conditions]
    return sql.SQL(" AND ").join(clauses), parameters


def _condition(column: sql.Composable, condition: Condition, bind: Any) -> sql.Composable:
    value = sql.SQL("({} -> {})").format(column, bind(condition.field))
    if condition.operator == "eq":
        # JSON equality: 2020 matches 2020 and 2020.0, true only true, "2020" only the string.
        return sql.SQL("{} = {}").format(value, bind(Jsonb(condition.value)))
    if condition.operator == "in":
        return sql.SQL("{} = ANY({}::jsonb[])").format(value, bind([Jsonb(v) for v in condition.value]))
    operator = sql.SQL(_COMPARE[condition.operator])
    # CASE, not AND: Postgres may evaluate the cast before the type test.
    if isinstance(condition.value, str):
        # ISO dates compare as text, as in SQLite; only string values take part.
        typed = sql.SQL("CASE WHEN jsonb_typeof({v}) = 'string' THEN {v} #>> '{{}}' END").format(v=value)
        return sql.SQL("{} {} {}").format(typed, operator, bind(condition.value))
    typed = sql.SQL("CASE WHEN jsonb_typeof({v}) = 'number' THEN ({v} #>> '{{}}')::float8 END").format(
        v=value
    )
    return sql.SQL("{} {} {}").format(typed, operator, bind(float(condition.value)))

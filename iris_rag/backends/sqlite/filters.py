"""Metadata filters compiled to SQLite: json_type and json_extract over the documents' JSON metadata column.

The semantics are PostgreSQL's (jsonb), so both stores return the same documents for the same filter: eq is
JSON equality (2020 matches 2020 and 2020.0, true only true, "2020" only the string, null only null), `in`
is any of its values (objects and arrays compared as JSON values), and a range compares strings (ISO
dates) as text and numbers as numbers, each only against stored values of its own JSON type. SQLite alone
would compare true equal to 1 (json_extract gives 1) and order any string above any number. A stored array
passes a test when one of its elements (json_each) does, by the same typed comparisons.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import orjson

from iris_rag.stores.filters import Condition, MetadataFilter, json_equal

_SQL = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
# SQLite's json_type names of the JSON types a filter value can have.
_NUMBER = "('integer', 'real')"
# The SQL function testing a stored compound value (object or array) against a JSON array of candidates.
JSON_IN_FUNCTION = "rag_json_in"


def json_path(field: str) -> str:
    """The SQLite JSON path of a top-level metadata key (quoted, so dots stay part of the name)."""
    return f'$."{field}"'


def _json_in(stored: str | None, candidates: str) -> int:
    """1 when a stored compound value (JSON text) equals one of the candidates (a JSON array), as jsonb."""
    if stored is None:
        return 0
    value = orjson.loads(stored)
    return int(any(json_equal(value, wanted) for wanted in orjson.loads(candidates)))


def register_functions(connection: sqlite3.Connection) -> None:
    """Give a connection the SQL functions filters use (every connection of the store gets them)."""
    connection.create_function(JSON_IN_FUNCTION, 2, _json_in, deterministic=True)


@dataclass(frozen=True, slots=True)
class _Operand:
    """What a test compares: SQL giving its json_type name and its value, and what each of the two binds."""

    kind: str
    value: str
    parameters: tuple[Any, ...]


def to_sql(metadata_filter: MetadataFilter, column: str = "d.metadata") -> tuple[str, list[Any]]:
    """A WHERE fragment (AND of every condition) over a JSON metadata column, with its parameters."""
    clauses: list[str] = []
    parameters: list[Any] = []
    for test in metadata_filter.value_tests:
        clause, values = _value_test(column, test)
        clauses.append(clause)
        parameters.extend(values)
    return " AND ".join(clauses), parameters


def _value_test(column: str, test: tuple[Condition, ...]) -> tuple[str, list[Any]]:
    """The stored value passes every condition of the test, or it is an array and one element does.

    Only an array's elements: json_each would also walk an object's members, which are not elements.
    """
    path = json_path(test[0].field)
    stored = _Operand(f"json_type({column}, ?)", f"json_extract({column}, ?)", (path,))
    whole, whole_parameters = _passes(stored, test)
    element, element_parameters = _passes(_Operand("e.type", "e.value", ()), test)
    clause = (
        f"({whole} OR (json_type({column}, ?) = 'array' AND "
        f"EXISTS (SELECT 1 FROM json_each({column}, ?) AS e WHERE {element})))"
    )
    return clause, [*whole_parameters, path, path, *element_parameters]


def _passes(operand: _Operand, test: tuple[Condition, ...]) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    parameters: list[Any] = []
    for condition in test:
        clause, values = _condition(operand, condition)
        clauses.append(clause)
        parameters.extend(values)
    return "(" + " AND ".join(clauses) + ")", parameters


def _condition(operand: _Operand, condition: Condition) -> tuple[str, list[Any]]:
    kind, value, binds = operand.kind, operand.value, operand.parameters
    if condition.operator in _SQL:
        operator = _SQL[condition.operator]
        if isinstance(condition.value, str):  # ISO dates compare as text, strings only
            text = f"(CASE WHEN {kind} = 'text' THEN {value} END) {operator} ?"
            return text, [*binds, *binds, condition.value]
        typed = f"(CASE WHEN {kind} IN {_NUMBER} THEN {value} END) {operator} ?"
        return typed, [*binds, *binds, float(condition.value)]
    wanted = condition.value if condition.operator == "in" else (condition.value,)
    return _any_of(operand, list(wanted))


def _any_of(operand: _Operand, wanted: list[Any]) -> tuple[str, list[Any]]:
    """The value equals one of `wanted` (JSON equality); one test per JSON type present."""
    kind, value, binds = operand.kind, operand.value, operand.parameters
    numbers = [v for v in wanted if isinstance(v, int | float) and not isinstance(v, bool)]
    strings = [v for v in wanted if isinstance(v, str)]
    literals = sorted(
        {
            "true" if v is True else "false" if v is False else "null"
            for v in wanted
            if v is None or v is True or v is False
        }
    )
    compound = [v for v in wanted if isinstance(v, dict | list | tuple)]
    tests: list[str] = []
    parameters: list[Any] = []
    if numbers:
        tests.append(f"({kind} IN {_NUMBER} AND {value} IN ({','.join('?' * len(numbers))}))")
        parameters += [*binds, *binds, *numbers]
    if strings:
        tests.append(f"({kind} = 'text' AND {value} IN ({','.join('?' * len(strings))}))")
        parameters += [*binds, *binds, *strings]
    if literals:
        tests.append(f"{kind} IN ({','.join('?' * len(literals))})")
        parameters += [*binds, *literals]
    if compound:
        tests.append(f"({kind} IN ('object', 'array') AND {JSON_IN_FUNCTION}({value}, ?))")
        parameters += [*binds, *binds, orjson.dumps(compound).decode()]
    return "(" + " OR ".join(tests) + ")", parameters

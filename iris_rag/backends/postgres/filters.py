"""Metadata filters compiled to PostgreSQL: JSONB operators over the documents' metadata column."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from iris_rag.stores.filters import Condition, MetadataFilter

_COMPARE = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
# Binds a value as a named parameter of the fragment and gives its placeholder.
_Bind = Callable[[Any], sql.Composable]


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
    clauses = [_value_test(target, test, bind) for test in metadata_filter.value_tests]
    return sql.SQL(" AND ").join(clauses), parameters


def _value_test(column: sql.Composable, test: tuple[Condition, ...], bind: _Bind) -> sql.Composable:
    """The stored value passes every condition of the test, or it is an array and one element does."""
    stored = sql.SQL("({} -> {})").format(column, bind(test[0].field))
    bounds = [_bound(condition, bind) for condition in test]
    whole = sql.SQL(" AND ").join(_condition(stored, c, b) for c, b in zip(test, bounds, strict=True))
    # The type test first spares a scalar the element test (the subquery made scalar filters 2x slower).
    is_array = sql.SQL("jsonb_typeof({}) = 'array'").format(stored)
    scalars = _scalar_candidates(test)
    if scalars is not None:
        # One containment test for both: a scalar contains a scalar it equals as jsonb (1 = 1.0; true is
        # not 1; "2020" is not 2020; null only null), an array a scalar among its own elements ([[x]] does
        # not hold x). An OR of the equality and an array branch cost scalar fields 1.4x.
        candidates = bind([Jsonb(value) for value in scalars])
        return sql.SQL("({} @> ANY({}::jsonb[]))").format(stored, candidates)
    if all(condition.operator in _COMPARE for condition in test):
        # A range as a JSON path function, not a subquery: the subquery's cost made the planner rank every
        # chunk by distance before testing any document (a filtered vector search 1.7x slower, scalar
        # fields too). Path comparisons are typed as the rest (a number only with numbers, a string only
        # with strings, in code point order as SQLite's).
        path, variables = _range_path(test)
        return sql.SQL("(({}) OR ({} AND jsonb_path_exists({}, {}::jsonpath, {}, true)))").format(
            whole, is_array, stored, bind(path), bind(Jsonb(variables))
        )
    element = sql.SQL("e.value")
    any_element = sql.SQL(" AND ").join(_condition(element, c, b) for c, b in zip(test, bounds, strict=True))
    # jsonb_array_elements raises on a non-array: the CASE gives it NULL (no elements) in whatever order
    # Postgres evaluates the AND.
    return sql.SQL(
        "(({whole}) OR ({is_array} AND EXISTS (SELECT 1 FROM jsonb_array_elements("
        "CASE WHEN {is_array} THEN {v} END) AS e(value) WHERE {element})))"
    ).format(whole=whole, is_array=is_array, v=stored, element=any_element)


def _range_path(test: tuple[Condition, ...]) -> tuple[str, dict[str, Any]]:
    """A JSON path that holds when one element of an array passes every bound of the test, and its values.

    Strict mode: lax would unwrap an element that is itself a list ([[2020]] would hold 2020; on SQLite
    it does not). A scalar (the array test comes first, but Postgres may evaluate either side of the AND
    first) raises in strict mode: the call is silent, so it is only false.
    """
    tests: list[str] = []
    variables: dict[str, Any] = {}
    for number, condition in enumerate(test):
        kind = "string" if isinstance(condition.value, str) else "number"
        variables[f"b{number}"] = condition.value if kind == "string" else float(condition.value)
        tests.append(f'@.type() == "{kind}" && @ {_COMPARE[condition.operator]} $b{number}')
    return f"strict $[*] ? ({' && '.join(tests)})", variables


def _scalar_candidates(test: tuple[Condition, ...]) -> tuple[Any, ...] | None:
    """The values an eq or `in` test accepts when all are scalars (None for a range or an object/list)."""
    (condition, *others) = test
    if others or condition.operator not in ("eq", "in"):
        return None
    values: tuple[Any, ...] = condition.value if condition.operator == "in" else (condition.value,)
    return None if any(isinstance(v, dict | list | tuple) for v in values) else values


def _bound(condition: Condition, bind: _Bind) -> sql.Composable:
    """The condition's value as a parameter, bound once for the stored value's test and its elements'."""
    if condition.operator == "eq":
        return bind(Jsonb(condition.value))
    if condition.operator == "in":
        return bind([Jsonb(v) for v in condition.value])
    return bind(condition.value if isinstance(condition.value, str) else float(condition.value))


def _condition(value: sql.Composable, condition: Condition, bound: sql.Composable) -> sql.Composable:
    if condition.operator == "eq":
        # JSON equality: 2020 matches 2020 and 2020.0, true only true, "2020" only the string.
        return sql.SQL("{} = {}").format(value, bound)
    if condition.operator == "in":
        return sql.SQL("{} = ANY({}::jsonb[])").format(value, bound)
    operator = sql.SQL(_COMPARE[condition.operator])
    # CASE, not AND: Postgres may evaluate the cast before the type test.
    if isinstance(condition.value, str):
        # ISO dates compare as text, as in SQLite; only string values take part.
        typed = sql.SQL("CASE WHEN jsonb_typeof({v}) = 'string' THEN {v} #>> '{{}}' END").format(v=value)
        return sql.SQL("{} {} {}").format(typed, operator, bound)
    typed = sql.SQL("CASE WHEN jsonb_typeof({v}) = 'number' THEN ({v} #>> '{{}}')::float8 END").format(
        v=value
    )
    return sql.SQL("{} {} {}").format(typed, operator, bound)

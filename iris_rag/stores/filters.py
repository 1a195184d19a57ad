"""Metadata filters (options.filters): equality, `in`, ranges on numbers and ISO dates, all ANDed.

A list in the metadata (front matter's `tags: [a, b]`) passes a condition when one of its elements does, as
in MongoDB or Elasticsearch: {"tags": "a"} is membership, {"tags": {"in": [..]}} a shared element, and a
field's range bounds must hold on one element together. One level only: [[2020]] holds a list, not 2020.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Literal

from iris_rag.errors import InvalidParametersError

Operator = Literal["eq", "in", "gt", "gte", "lt", "lte"]
RANGE_OPERATORS = ("gt", "gte", "lt", "lte")
_FIELD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, slots=True)
class Condition:
    """One test on one metadata field."""

    field: str
    operator: Operator
    value: Any


@dataclass(frozen=True, slots=True)
class MetadataFilter:
    """Conditions that must all hold."""

    conditions: tuple[Condition, ...]

    @property
    def fields(self) -> list[str]:
        """The metadata fields the filter reads, in order, without repeats."""
        return list(dict.fromkeys(c.field for c in self.conditions))

    @property
    def value_tests(self) -> list[tuple[Condition, ...]]:
        """The conditions as one value (or one list element) must pass them together, in order.

        eq and `in` stand alone; a field's range bounds form one test, so {"gt": 2018, "lt": 2022} needs
        an element between them, not one element above 2018 and another below 2022.
        """
        tests: dict[str | int, list[Condition]] = {}
        for index, condition in enumerate(self.conditions):
            key = condition.field if condition.operator in RANGE_OPERATORS else index
            tests.setdefault(key, []).append(condition)
        return [tuple(test) for test in tests.values()]


def json_kind(value: Any) -> str:
    """The JSON type of a decoded value: boolean, number, string, null, array or object."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "array" if isinstance(value, list | tuple) else "object"


def json_equal(left: Any, right: Any) -> bool:
    """Equality of two JSON values as PostgreSQL's jsonb compares them (every store's eq and `in`)."""
    kind = json_kind(left)
    if kind != json_kind(right):
        return False
    if kind == "array":
        return len(left) == len(right) and all(json_equal(a, b) for a, b in zip(left, right, strict=True))
    if kind == "object":
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    return bool(left == right)


# Integers a filter may hold: what SQLite binds (64-bit); past that no store could match them alike.
_INT_LIMIT = 2**63 - 1


def _check_json(field: str, value: Any) -> None:
    """A filter value must be JSON: finite numbers, 64-bit integers, strings, booleans, null, lists, dicts."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if abs(value) > _INT_LIMIT:
            msg = f"filter {field}: the integer {value} is out of range (at most 2^63 - 1 in magnitude)"
            raise InvalidParametersError(msg)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            msg = f"filter {field}: {value!r} is not a JSON number"
            raise InvalidParametersError(msg)
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_json(field, item)
        return
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        for item in value.values():
            _check_json(field, item)
        return
    msg = f"filter {field}: {value!r} is not a JSON value"
    raise InvalidParametersError(msg)


def _is_iso_date(value: str) -> bool:
    try:
        (datetime if "T" in value or " " in value else date).fromisoformat(value)
    except ValueError:
        return False
    return True


def _finite(value: float) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an integer past the float range
        return False


def _range_value(field: str, operator: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        msg = f"filter {field}.{operator} needs a number or an ISO date, got {value!r}"
        raise InvalidParametersError(msg)
    if not isinstance(value, str) and not _finite(value):
        msg = f"filter {field}.{operator} needs a finite number, got {value!r}"
        raise InvalidParametersError(msg)
    if isinstance(value, str) and not _is_iso_date(value):
        msg = f"filter {field}.{operator}: {value!r} is not an ISO 8601 date (YYYY-MM-DD[THH:MM:SS])"
        raise InvalidParametersError(msg)
    return value


def parse_filters(raw: dict[str, Any] | None) -> MetadataFilter | None:
    """Turn options.filters into conditions; a malformed filter is INVALID_PARAMETERS."""
    if not raw:
        return None
    conditions: list[Condition] = []
    for field, spec in raw.items():
        if not _FIELD.match(field):
            msg = f"filter field {field!r} must be 1-64 letters, digits, '_', '.', '-'"
            raise InvalidParametersError(msg)
        if not isinstance(spec, dict):
            if isinstance(spec, list):
                msg = f"filter {field}: use {{'in': [...]}} to match any of several values"
                raise InvalidParametersError(msg)
            _check_json(field, spec)
            conditions.append(Condition(field, "eq", spec))
            continue
        if not spec:
            msg = f"filter {field} is an empty object; use in, gt, gte, lt or lte"
            raise InvalidParametersError(msg)
        for operator, value in spec.items():
            if operator == "in":
                if not isinstance(value, list) or not value:
                    msg = f"filter {field}.in needs a non-empty list"
                    raise InvalidParametersError(msg)
                _check_json(field, value)
                conditions.append(Condition(field, "in", tuple(value)))
            elif operator in RANGE_OPERATORS:
                conditions.append(Condition(field, operator, _range_value(field, operator, value)))
            else:
                msg = f"filter {field}: unknown operator {operator!r}; use in, gt, gte, lt or lte"
                raise InvalidParametersError(msg)
    return MetadataFilter(tuple(conditions))

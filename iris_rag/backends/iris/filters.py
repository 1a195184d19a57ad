"""Metadata filters evaluated in Python on the decoded metadata, with the PostgreSQL backend's semantics.

IRIS keeps a document's metadata as JSON text; testing it here keeps every filter the same on all three
backends without IRIS-specific JSON SQL: eq is JSON equality (2020 matches 2020 and 2020.0, true only true,
"2020" only the string), in is any of them, and a range compares strings (ISO dates) as text and numbers as
numbers, each only against values of its own kind. A list passes a test when one of its elements does.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from iris_rag.stores.filters import Condition, MetadataFilter, json_equal, json_kind

_MISSING = object()
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}


def _passes(value: Any, condition: Condition) -> bool:
    if condition.operator == "eq":
        return json_equal(value, condition.value)
    if condition.operator == "in":
        return any(json_equal(value, wanted) for wanted in condition.value)
    compare = _COMPARE[condition.operator]
    if isinstance(condition.value, str):
        return isinstance(value, str) and compare(value, condition.value)
    return json_kind(value) == "number" and compare(float(value), float(condition.value))


def _holds(metadata: dict[str, Any], test: tuple[Condition, ...]) -> bool:
    """The field's value passes every condition of the test, or it is a list and one element does."""
    value = metadata.get(test[0].field, _MISSING)
    if value is _MISSING:
        return False
    if all(_passes(value, condition) for condition in test):
        return True
    return isinstance(value, list) and any(all(_passes(item, c) for c in test) for item in value)


def matches(metadata: dict[str, Any], metadata_filter: MetadataFilter | None) -> bool:
    """Whether a document's metadata passes every condition (no filter: always)."""
    if metadata_filter is None:
        return True
    return all(_holds(metadata, test) for test in metadata_filter.value_tests)

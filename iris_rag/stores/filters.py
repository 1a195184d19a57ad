"""Metadata filters (options.filters): equality, `in`, ranges on numbers and ISO dates, all ANDed."""

from __future__ import annotations

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


def _is_iso_date(value: str) -> bool:
    try:
        (datetime if "T" in value or " " in value else date).fromisoformat(value)
    except ValueError:
        return False
    return True


def _range_value(field: str, operator: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        msg = f"filter {field}.{operator} needs a number or an ISO date, got {value!r}"
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
                conditions.append(Condition(field, "in", tuple(value)))
            elif operator in RANGE_OPERATORS:
                conditions.append(Condition(field, operator, _range_value(field, operator, value)))
            else:
                msg = f"filter {field}: unknown operator {operator!r}; use in, gt, gte, lt or lte"
                raise InvalidParametersError(msg)
    return MetadataFilter(tuple(conditions))

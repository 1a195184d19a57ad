"""Which call records a metrics read covers, as the WHERE clause every store backend runs."""

from __future__ import annotations

from typing import Any

from iris_rag.stores.base import CallFilter

# A call record's columns in CallFigures' order, then the caller's ids: what every store writes and reads.
CALL_FIGURE_COLUMNS = "ts, tool, technique, duration_ms, success, error_code, principal"
CALL_COLUMNS = f"{CALL_FIGURE_COLUMNS}, request_id, session_id"


def covered_calls(which: CallFilter, before: float | None = None, *, mark: str) -> tuple[str, list[Any]]:
    """The WHERE clause, and its parameters, of the call records a filter covers (before a UNIX time).

    Constant text and the driver's placeholder `mark` (`?`, `%s`) only: the values go in the parameters.
    An empty technique list covers no record (IRIS refuses an empty IN list).
    """
    clauses = [f"ts >= {mark}"]
    parameters: list[Any] = [which.since]
    if before is not None:
        clauses.append(f"ts < {mark}")
        parameters.append(before)
    if which.techniques is not None:
        marks = ", ".join([mark] * len(which.techniques))
        clauses.append(f"technique IN ({marks})" if which.techniques else "1 = 0")
        parameters.extend(which.techniques)
    if which.principal is not None:
        clauses.append(f"principal = {mark}")
        parameters.append(which.principal)
    return " AND ".join(clauses), parameters

"""The bridge wire format: one JSON object per line, requests and responses correlated by id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from iris_rag.access import Principal
from iris_rag.errors import MalformedRequestError

RequestId = str | int | None

# Why a request's token was set, by the `reason` a `cancel` request names; the monitor records a call
# cancelled for "timeout" as TIMEOUT_EXCEEDED (the client saw that), any other as REQUEST_CANCELLED.
CANCEL_REASONS = {
    "timeout": "the call ran past the front end's REQUEST_TIMEOUT_MS",
    "client": "cancelled by the client",
}
TIMEOUT_REASON = CANCEL_REASONS["timeout"]
# The longest answer line the worker writes (newline included): past it the call gets RESULT_TOO_LARGE.
# The front end reads each line whole into one string and then copies it into the MCP result (twice over:
# text and structuredContent), so it stays far below V8's longest string (about 512 M characters);
# bridge.ts MAX_ANSWER_BYTES is the same number (tests/worker/test_answers.py).
MAX_ANSWER_BYTES = 64 * 1024 * 1024

# The front end writes "id" first; this reads it from a line that is not valid JSON further on (a lone
# surrogate, nesting past orjson's limit), so the error still reaches the call that sent it.
_LEADING_ID = re.compile(rb'^\s*\{\s*"id"\s*:\s*(?:"((?:[^"\\]|\\.){0,200})"|(-?\d{1,18})\s*[,}])')


@dataclass(frozen=True, slots=True)
class Request:
    """{id, method, params, principal?, timestamp}: principal is the HTTP caller (absent: the local user).

    sent_at is the timestamp as a UNIX time: when the front end took the call, before it queued it (None
    when absent or unreadable). A call's recorded duration runs from it: what the caller waited.
    """

    id: RequestId
    method: str
    params: dict[str, Any]
    principal: Principal | None = None
    sent_at: float | None = None


def _timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def read_request_id(line: bytes) -> RequestId:
    """The id at the start of a request line, read without parsing the rest; None if there is none."""
    match = _LEADING_ID.match(line[:512])
    if match is None:
        return None
    if match.group(2) is not None:
        return int(match.group(2))
    try:
        value = orjson.loads(b'"' + match.group(1) + b'"')
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


def parse_request(line: bytes) -> Request:
    """Decode one line; raise MalformedRequestError (with the id, when one could be read)."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        msg = f"line is not valid JSON: {exc}"
        raise MalformedRequestError(msg, {"id": read_request_id(line)}) from exc
    if not isinstance(message, dict):
        msg = "a request must be a JSON object"
        raise MalformedRequestError(msg)
    request_id = message.get("id")
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        msg = "a request needs an 'id' (string or integer)"
        raise MalformedRequestError(msg)
    method = message.get("method")
    params = message.get("params", {})
    if not isinstance(method, str) or not isinstance(params, dict):
        msg = "a request needs a string 'method' and an object 'params'"
        raise MalformedRequestError(msg, {"id": request_id})
    raw_principal = message.get("principal")
    try:
        principal = None if raw_principal is None else Principal.from_wire(raw_principal)
    except MalformedRequestError as exc:
        raise MalformedRequestError(exc.message, {"id": request_id}) from exc
    return Request(request_id, method, params, principal, _sent_at(message.get("timestamp")))


def _sent_at(timestamp: Any) -> float | None:
    """A request's ISO 8601 timestamp as a UNIX time; None if it has none a clock can read."""
    if not isinstance(timestamp, str):
        return None
    try:
        moment = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def success_line(request_id: RequestId, result: Any) -> bytes:
    """Encode a success response."""
    return orjson.dumps(
        {"id": request_id, "success": True, "result": result, "timestamp": _timestamp()},
        option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY,
    )


def error_line(request_id: RequestId, error: dict[str, Any]) -> bytes:
    """Encode an error response."""
    return orjson.dumps(
        {"id": request_id, "success": False, "error": error, "timestamp": _timestamp()},
        option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY,
    )


def progress_line(request_id: RequestId, steps: int, message: str) -> bytes:
    """A step of a running request (an event, not its answer): the front end relays it to the client."""
    return orjson.dumps(
        {"id": request_id, "event": "progress", "progress": steps, "message": message},
        option=orjson.OPT_APPEND_NEWLINE,
    )


def ready_line(pid: int) -> bytes:
    """The line written once the worker can serve: it tells a start-up failure from a crash."""
    return orjson.dumps({"id": None, "event": "ready", "pid": pid}, option=orjson.OPT_APPEND_NEWLINE)

"""Check tool arguments against the same JSON Schemas the MCP front end serves."""

from __future__ import annotations

from functools import cache
from typing import Any

from jsonschema import Draft202012Validator

from iris_rag.errors import InvalidParametersError, InvalidQueryError, PipelineNotFoundError
from iris_rag.schemas import tool_spec


@cache
def _validator(tool_name: str) -> Draft202012Validator:
    spec = tool_spec(tool_name)
    if spec is None:
        msg = f"no tool named {tool_name!r}"
        raise PipelineNotFoundError(msg)
    return Draft202012Validator(spec["inputSchema"])


def validate_arguments(tool_name: str, arguments: Any) -> dict[str, Any]:
    """Return the arguments if they conform; else raise INVALID_QUERY (query errors) or INVALID_PARAMETERS."""
    errors = sorted(_validator(tool_name).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        assert isinstance(arguments, dict)
        return arguments
    messages = [
        f"{'/' + '/'.join(map(str, e.absolute_path)) if e.absolute_path else '(root)'}: {e.message}"
        for e in errors
    ]
    about_query = any(
        list(e.absolute_path)[:1] == ["query"] or (e.validator == "required" and "'query'" in e.message)
        for e in errors
    )
    error_class = InvalidQueryError if about_query else InvalidParametersError
    raise error_class(f"invalid arguments for {tool_name}: " + "; ".join(messages), {"errors": messages})

"""Check tool arguments against the same JSON Schemas the MCP front end serves."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator, ValidationError, validators

from iris_rag.errors import InvalidParametersError, InvalidQueryError, PipelineNotFoundError
from iris_rag.schemas import tool_spec


def json_depth(value: Any, limit: int) -> int:
    """How deeply objects and arrays nest in value (a scalar is 0); stops counting past limit."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((child, depth) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _max_depth(
    _validator: Any, limit: int, instance: Any, _schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """The schemas' `maxDepth` keyword (free-form JSON such as metadata): nesting at most `limit` levels."""
    if json_depth(instance, limit) > limit:
        yield ValidationError(f"is nested more than {limit} levels deep")


# Draft 2020-12 plus `maxDepth`, which the front end's Ajv implements the same way (validation.ts).
_SchemaValidator = validators.extend(Draft202012Validator, {"maxDepth": _max_depth})


@cache
def _validator(tool_name: str) -> Any:
    spec = tool_spec(tool_name)
    if spec is None:
        msg = f"no tool named {tool_name!r}"
        raise PipelineNotFoundError(msg)
    return _SchemaValidator(spec["inputSchema"])


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

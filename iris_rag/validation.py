"""Check tool arguments against the same JSON Schemas the MCP front end serves."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import pydantic
from jsonschema import Draft202012Validator, ValidationError, validators

from iris_rag.errors import (
    InvalidParametersError,
    InvalidQueryError,
    MissingRequiredFieldError,
    PipelineNotFoundError,
    RagError,
)
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
    """Return the arguments if they conform; else raise one error with every problem in details.errors.

    MISSING_REQUIRED_FIELD when the only problems are absent required arguments; else INVALID_QUERY when
    one is about the query; else INVALID_PARAMETERS. The front end decides the same way (validation.ts).
    """
    errors = sorted(_validator(tool_name).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        assert isinstance(arguments, dict)
        return arguments
    messages = [
        f"{'/' + '/'.join(map(str, e.absolute_path)) if e.absolute_path else '(root)'}: {e.message}"
        for e in errors
    ]
    details: dict[str, Any] = {"errors": messages}
    error_class: type[RagError]
    if all(e.validator == "required" for e in errors):
        # Only absent arguments (the query included): the spec's own code, naming each one.
        error_class = MissingRequiredFieldError
        details["missing"] = [_missing_name(e) for e in errors]
    elif any(list(e.absolute_path)[:1] == ["query"] for e in errors):
        error_class = InvalidQueryError
    else:
        error_class = InvalidParametersError
    raise error_class(f"invalid arguments for {tool_name}: " + "; ".join(messages), details)


def model_errors(error: pydantic.ValidationError) -> list[str]:
    """A parameter model's errors written as the schema's are ("/field: message"; a whole-model rule bare)."""
    messages = []
    for item in error.errors(include_url=False):
        text = str(item["msg"]).removeprefix("Value error, ")
        where = "".join(f"/{part}" for part in item["loc"])
        messages.append(f"{where}: {text}" if where else text)
    return messages


def _missing_name(error: ValidationError) -> str:
    """The absent property of a `required` error, as a JSON pointer (/query, /documents/0/content)."""
    path = "".join(f"/{part}" for part in error.absolute_path)
    # jsonschema's message is "'<name>' is a required property".
    name = error.message.split("'")[1] if error.message.count("'") >= 2 else error.message
    return f"{path}/{name}"

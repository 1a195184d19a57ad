"""Tool arguments for the fuzz suite: generated from the served inputSchemas, and what counts as valid.

Valid means: the arguments conform to the tool's inputSchema as JSON Schema defines it (regular expressions
with ECMA-262 semantics, as the front end's Ajv runs them) and break none of the content rules the tools
document beyond the schema (DOCUMENTED_RULES). A valid call must never be refused as INVALID_PARAMETERS or
INVALID_QUERY; any other answer (COLLECTION_NOT_FOUND, DOCUMENT_NOT_FOUND, ...) is a fine answer to it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from jsonschema import Draft202012Validator, ValidationError, validators
from pydantic import ValidationError as PydanticValidationError

from iris_rag.errors import InvalidParametersError
from iris_rag.pipeline import QueryOptions
from iris_rag.stores.filters import parse_filters
from iris_rag.techniques.sqlrag.tables import MAX_COLUMNS

REFUSAL_CODES = {"INVALID_PARAMETERS", "INVALID_QUERY", "MISSING_REQUIRED_FIELD"}
# Codes that say the server failed, not the caller: no input, valid or not, may get one in the fuzz run
# (sequential calls, no LLM, a healthy worker).
SERVER_FAILURE_CODES = {
    "RETRIEVAL_FAILED",
    "GENERATION_FAILED",
    "LLM_SERVICE_UNAVAILABLE",
    "EMBEDDING_SERVICE_UNAVAILABLE",
    "DATABASE_CONNECTION_FAILED",
    "TIMEOUT_EXCEEDED",
    "RATE_LIMIT_EXCEEDED",
    "WORKER_CRASHED",
    "WORKER_UNAVAILABLE",
    "MALFORMED_REQUEST",
    "METHOD_NOT_FOUND",
    "INTERNAL_ERROR",
}
FUZZ_COLLECTION = "fuzz"
FUZZ_DOCUMENT_IDS = ("seine", "photosynthesis", "python")

# ECMA-262 \s (WhiteSpace, LineTerminator); Python's \s differs (has \x1c-\x1f and \x85, lacks \ufeff).
_ECMA_NOT_SPACE = (
    "[^\\t\\n\\x0b\\x0c\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff]"
)


def _ecma_pattern(pattern: str) -> str:
    """The pattern with ECMA-262 meaning in Python's re: \\S as ECMA defines it, a final $ only at the end."""
    translated = pattern.replace("\\S", _ECMA_NOT_SPACE)
    return (
        translated[:-1] + "\\Z" if translated.endswith("$") and not translated.endswith("\\$") else translated
    )


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not re.search(_ecma_pattern(pattern), instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


EcmaValidator = validators.extend(Draft202012Validator, {"pattern": _pattern})


@cache
def _validator(schema_json: str) -> Any:
    import json

    return EcmaValidator(json.loads(schema_json))


def conforms(schema: dict[str, Any], arguments: Any) -> bool:
    """Whether the arguments conform to the schema (ECMA regular expressions)."""
    import json

    return bool(_validator(json.dumps(schema, sort_keys=True)).is_valid(arguments))


def _filters_rejected(arguments: dict[str, Any]) -> bool:
    """A metadata filter (a technique's options.filters, rag_delete_documents' filter) breaking its rules."""
    for filters in (arguments.get("options", {}).get("filters"), arguments.get("filter")):
        if filters is None:
            continue
        try:
            parse_filters(filters)
        except InvalidParametersError:
            return True
    return False


def _options_rejected(arguments: dict[str, Any]) -> bool:
    """options beyond the schema (QueryOptions.check): a ranking whose weights are all 0, a reputation
    weight without exactly one of reputation_field and reputation_sources, cot_steps with generate false."""
    options = arguments.get("options")
    if not isinstance(options, dict):
        return False
    try:
        QueryOptions.model_validate(options).check()
    except InvalidParametersError:
        return True
    except PydanticValidationError:
        return False
    return False


def _crag_rules(arguments: dict[str, Any]) -> bool:
    params = arguments.get("technique_params", {})
    # No web-search provider ships; incorrect_threshold must not exceed confidence_threshold.
    return bool(params.get("enable_web_search")) or params.get("incorrect_threshold", 0.4) > params.get(
        "confidence_threshold", 0.8
    )


def _sqlrag_rules(arguments: dict[str, Any], error: dict[str, Any]) -> bool:
    params = arguments.get("technique_params", {})
    # A caller's statement and allowed_tables are checked against the store; without sql and without an
    # LLM the call is refused with the schema to write one from (error.details.reason says which).
    reason = (error.get("details") or {}).get("reason")
    return "sql" in params or "allowed_tables" in params or reason in {"no_llm", "generation_disabled"}


def _ingest_table_rules(arguments: dict[str, Any]) -> bool:
    if ("rows" in arguments) == ("csv" in arguments) or "csv" in arguments:
        return True  # rows xor csv; CSV text has its own rules (header, field counts)
    columns = {key for row in arguments["rows"] for key in row}
    return not columns or len(columns) > MAX_COLUMNS


def _delete_documents_rules(arguments: dict[str, Any]) -> bool:
    # document_ids xor filter (a top-level oneOf would be refused by some LLM tool APIs), and a filter
    # with no condition, which would match every document.
    return ("document_ids" in arguments) == ("filter" in arguments) or arguments.get("filter") == {}


def _noderag_rules(arguments: dict[str, Any]) -> bool:
    params = arguments.get("technique_params", {})
    # Documented: node_depth "needs include_parent_context=true".
    return params.get("include_parent_context") is False and "node_depth" in params


# Content rules beyond the schema that a tool documents; each may refuse an otherwise valid call.
DOCUMENTED_RULES: dict[str, Callable[[dict[str, Any], dict[str, Any]], bool]] = {
    "rag_crag": lambda arguments, _: _crag_rules(arguments),
    "rag_sqlrag": _sqlrag_rules,
    "rag_noderag": lambda arguments, _: _noderag_rules(arguments),
    "rag_ingest_table": lambda arguments, _: _ingest_table_rules(arguments),
    "rag_table_schema": lambda arguments, _: "tables" in arguments,  # names must exist
    "rag_metrics": lambda arguments, _: "technique_filter" in arguments,  # techniques that exist
    "rag_delete_documents": lambda arguments, _: _delete_documents_rules(arguments),
    # documents xor paths; a generated path is never a file under RAG_INGEST_ROOTS (unset here anyway).
    "rag_ingest": lambda arguments, _: "paths" in arguments or "documents" not in arguments,
    # The collection named twice, exactly.
    "rag_delete_collection": lambda arguments, _: (
        arguments["collection_id"] != arguments["confirm_collection_id"]
    ),
}


def refusal_documented(tool: str, arguments: dict[str, Any], error: dict[str, Any]) -> bool:
    """Whether a documented content rule allows refusing these schema-valid arguments."""
    rule = DOCUMENTED_RULES.get(tool)
    return (
        _filters_rejected(arguments)
        or _options_rejected(arguments)
        or (rule is not None and rule(arguments, error))
    )


def _json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=max_leaves,
    )


# Strings a careless or hostile client sends: control characters, bidi overrides, fullwidth, NUL, huge.
HOSTILE_STRINGS = st.sampled_from(
    [
        "",
        " ",
        "\u3000\u00a0\t",
        "\x1c\x1d",
        "\ufeff",
        "\x00nul",
        "\u202eevil\u202c rtl",
        "\uff26\uff35\uff2c\uff2c\uff37\uff29\uff24\uff34\uff28 insulin",  # fullwidth letters
        "'; DROP TABLE documents; --",
        "../../etc/passwd",
        "x" * 3000,
        "y" * 100_000,
        "e\u0301\u0301\u0301 combining",
        "\U0001f600 emoji \U0001f9ec",
    ]
)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": value}
    return value


def valid_arguments(name: str, schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments generated from the schema, half of them aimed at the fuzz collection and its documents."""
    properties = schema.get("properties", {})

    def aim(pair: tuple[dict[str, Any], bool]) -> dict[str, Any]:
        arguments, aimed = pair
        if not aimed:
            return arguments
        if "collection_id" in properties and name != "rag_ingest_table":
            arguments = {**arguments, "collection_id": FUZZ_COLLECTION}
        if "document_id" in properties:
            arguments = {**arguments, "document_id": FUZZ_DOCUMENT_IDS[len(arguments) % 3]}
        return arguments

    generated = from_schema(schema)
    if "query" in properties:
        # Odd but valid text (fullwidth, bidi controls, emoji, combining marks) in a query that searches.
        hostile = st.builds(lambda a, q: {**a, "query": q}, generated, HOSTILE_STRINGS)
        generated = st.one_of(generated, hostile)
    return st.tuples(generated, st.booleans()).map(aim)


def invalid_arguments(name: str, schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Valid arguments broken one way: a required key dropped, an unknown key, a value of the wrong kind."""
    properties = sorted(schema.get("properties", {}))
    required = sorted(schema.get("required", []))

    def mutate(arguments: Any) -> st.SearchStrategy[dict[str, Any]]:
        choices: list[st.SearchStrategy[dict[str, Any]]] = [
            st.builds(lambda value: {**arguments, "unexpected_key": value}, _json_values()),
            st.dictionaries(st.text(max_size=12), _json_values(), max_size=4),
        ]
        if required:
            choices.append(
                st.sampled_from(required).map(lambda key: {k: v for k, v in arguments.items() if k != key})
            )
        if properties:
            keys = st.sampled_from(properties)
            choices += [
                st.builds(lambda key, value: {**arguments, key: value}, keys, _json_values()),
                st.builds(lambda key, value: {**arguments, key: value}, keys, HOSTILE_STRINGS),
                st.builds(
                    lambda key, depth: {**arguments, key: _nested(depth)},
                    keys,
                    st.sampled_from([2, 30, 120]),
                ),
                st.builds(
                    lambda key, number: {**arguments, key: number},
                    keys,
                    st.sampled_from([-1, 0, 10**12, 2**63, -0.5, 1e308, 3.5]),
                ),
            ]
        return st.one_of(choices)

    return from_schema(schema).flatmap(mutate)

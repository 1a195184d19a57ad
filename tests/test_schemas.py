"""One source of truth: the JSON files, the pydantic models and the registry agree."""

import json
import re
from typing import Any

import pytest

from iris_rag.pipeline import QueryOptions, TechniqueRequest
from iris_rag.schemas import CORRELATION_FIELDS, SCHEMA_DIR, technique_tools, tool_spec, tool_specs
from iris_rag.techniques.registry import PIPELINES


def _no_refs(node: object) -> bool:
    if isinstance(node, dict):
        return "$ref" not in node and all(_no_refs(v) for v in node.values())
    if isinstance(node, list):
        return all(_no_refs(v) for v in node)
    return True


def test_every_tool_is_complete_and_self_contained() -> None:
    names = {spec["name"] for spec in tool_specs()}
    assert {
        "rag_basic",
        "rag_ingest",
        "rag_list_collections",
        "rag_get_document",
        "rag_health_check",
        "rag_metrics",
    } <= names
    for spec in tool_specs():
        assert spec["description"] and spec["title"]
        assert spec["inputSchema"]["type"] == "object"
        assert spec["outputSchema"]["type"] == "object"
        assert set(spec["annotations"]) >= {"readOnlyHint", "destructiveHint"}
        assert _no_refs(spec), f"{spec['name']} still has a $ref"


def test_pydantic_models_match_the_schema() -> None:
    spec = tool_spec("rag_basic")
    assert spec is not None
    options = spec["inputSchema"]["properties"]["options"]["properties"]
    assert set(options) == set(QueryOptions.model_fields)
    for name, field in QueryOptions.model_fields.items():
        assert options[name].get("default") == field.default, name
    # request_id and session_id belong to the call (echoed by the dispatcher), not to the technique.
    envelope = set(spec["inputSchema"]["properties"]) - set(CORRELATION_FIELDS)
    assert envelope == set(TechniqueRequest.model_fields)


def test_every_tool_takes_and_returns_the_shared_correlation_ids() -> None:
    common = json.loads((SCHEMA_DIR / "common.json").read_text())["$defs"]
    for spec in tool_specs():
        for schema in (spec["inputSchema"], spec["outputSchema"]):
            for name in CORRELATION_FIELDS:
                assert schema["properties"][name] == common[name], (spec["name"], name)
            assert not set(CORRELATION_FIELDS) & set(schema.get("required", [])), spec["name"]


def test_every_technique_tool_has_a_pipeline() -> None:
    assert set(technique_tools()) == set(PIPELINES)


# JavaScript's \s (what Ajv runs in the front end): ECMA-262 WhiteSpace and LineTerminator.
ECMA_WHITESPACE = set("\t\n\v\f\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | {
    chr(c) for c in range(0x2000, 0x200B)
}


def test_not_blank_patterns_read_the_same_in_python_and_javascript() -> None:
    """Only-whitespace text, by either engine's definition, is blank to both (the fuzz suite found \\x1c)."""
    python_whitespace = {chr(c) for c in range(0x110000) if chr(c).isspace()}
    patterns = {
        tool_spec("rag_basic")["inputSchema"]["properties"]["query"]["pattern"],  # type: ignore[index]
        tool_spec("rag_graph_explore")["inputSchema"]["properties"]["entity"]["pattern"],  # type: ignore[index]
    }
    assert len(patterns) == 1, "one definition of 'not blank'"
    pattern = re.compile(patterns.pop())
    for char in sorted(python_whitespace | ECMA_WHITESPACE):
        assert pattern.search(char * 3) is None, f"{char!r} counts as text"
    for text in ["a", "\u200bx", "\uff26\uff35\uff2c\uff2c", "\u202eevil\u202c"]:
        assert pattern.search(text), text


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional field's schema as the JSON files write it: absent means None, so no null branch."""
    branches = [b for b in schema.get("anyOf", []) if b.get("type") != "null"]
    if len(branches) == 1 and len(schema["anyOf"]) == 2:
        return {**{k: v for k, v in schema.items() if k != "anyOf"}, **branches[0]}
    return schema


_CONSTRAINTS = (
    "type",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "default",
    "pattern",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "uniqueItems",
    "items",
)


@pytest.mark.parametrize("technique", sorted(PIPELINES))
def test_technique_params_schema_and_model_agree(technique: str) -> None:
    """Each technique's technique_params, as the JSON file declares it (what MCP clients see and both the
    front end and the worker validate) and as its pydantic model parses it, allow exactly the same values."""
    spec = tool_spec(f"rag_{technique}")
    assert spec is not None
    declared = spec["inputSchema"]["properties"]["technique_params"]
    assert declared["additionalProperties"] is False
    model = PIPELINES[technique].params_model.model_json_schema()
    assert set(declared.get("properties", {})) == set(model.get("properties", {})), technique
    for name, field_schema in declared.get("properties", {}).items():
        parsed = _without_null(model["properties"][name])
        for key in _CONSTRAINTS:
            assert field_schema.get(key) == parsed.get(key), (technique, name, key)


def test_no_input_schema_combines_schemas_at_the_top_level() -> None:
    """Some LLM tool APIs refuse a tool whose input_schema has oneOf, anyOf or allOf at its root (and with it
    every request listing the tool), so "exactly one of" rules are checked by the worker instead."""
    for spec in tool_specs():
        assert not {"oneOf", "anyOf", "allOf"} & set(spec["inputSchema"]), spec["name"]

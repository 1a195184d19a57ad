"""The tool schemas: these JSON files are the one definition the worker and the front end share."""

from __future__ import annotations

import copy
import json
from collections.abc import Collection
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).parent
_COMMON_PREFIX = "common.json#/$defs/"
CORRELATION_FIELDS = ("request_id", "session_id")
"""Optional on every tool, echoed in its result (common.json's definitions; added here to each tool)."""

JsonObject = dict[str, Any]


@cache
def _common_defs() -> JsonObject:
    """Load the shared definitions once."""
    defs: JsonObject = json.loads((SCHEMA_DIR / "common.json").read_text(encoding="utf-8"))["$defs"]
    return defs


def _inline(node: Any) -> Any:
    """Replace every reference to common.json with the definition itself, recursively."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_COMMON_PREFIX):
            target = _common_defs()[ref.removeprefix(_COMMON_PREFIX)]
            return _inline(copy.deepcopy(target))
        return {key: _inline(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item) for item in node]
    return node


def _technique_input_schema(technique_params: JsonObject) -> JsonObject:
    """Every technique tool takes the same envelope; only technique_params differs."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["query"],
        "properties": {
            "query": {"$ref": f"{_COMMON_PREFIX}query"},
            "collection_id": {"$ref": f"{_COMMON_PREFIX}collection_id"},
            "options": {"$ref": f"{_COMMON_PREFIX}options"},
            "technique_params": technique_params,
        },
    }


@cache
def _load_tools() -> tuple[JsonObject, ...]:
    tools = []
    for path in sorted((SCHEMA_DIR / "tools").glob("*.json")):
        spec: JsonObject = json.loads(path.read_text(encoding="utf-8"))
        if "technique_params" in spec:
            spec["inputSchema"] = _technique_input_schema(spec.pop("technique_params"))
            spec["outputSchema"] = {"$ref": f"{_COMMON_PREFIX}technique_response"}
        tools.append(_inline(_with_correlation(spec)))
    return tuple(tools)


def _with_correlation(spec: JsonObject) -> JsonObject:
    """request_id and session_id in the tool's input and output: one definition, referenced by every tool."""
    for schema in (spec["inputSchema"], spec.get("outputSchema")):
        if schema is None:
            continue
        if "$ref" in schema:  # the technique tools' shared response: inlined first, then extended
            schema.update(_inline({"$ref": schema.pop("$ref")}))
        properties = schema.setdefault("properties", {})
        for name in CORRELATION_FIELDS:
            properties[name] = {"$ref": f"{_COMMON_PREFIX}{name}"}
    return spec


def tool_specs() -> list[JsonObject]:
    """All tools, each with name, title, description, annotations, bridge, inputSchema and outputSchema."""
    return copy.deepcopy(list(_load_tools()))


def tool_spec(name: str) -> JsonObject | None:
    """One tool's spec by its MCP name, or None."""
    for spec in _load_tools():
        if spec["name"] == name:
            return copy.deepcopy(spec)
    return None


def technique_tools() -> dict[str, str]:
    """Map technique name to tool name for the tools that run a pipeline."""
    return {
        spec["bridge"]["technique"]: spec["name"] for spec in _load_tools() if "technique" in spec["bridge"]
    }


def technique_of(spec: JsonObject) -> str | None:
    """The technique a tool needs (bridge.technique, or bridge.served_by); None for tools always served."""
    bridge: JsonObject = spec["bridge"]
    technique = bridge.get("technique") or bridge.get("served_by")
    return technique if isinstance(technique, str) else None


def served_tool_specs(techniques: Collection[str]) -> list[JsonObject]:
    """The tools served with these techniques: a tool is listed iff it is served.

    The front end builds the same list from these files (mcp-server/src/schemas.ts) to list the tools
    without the worker.
    """
    return [spec for spec in tool_specs() if (t := technique_of(spec)) is None or t in techniques]

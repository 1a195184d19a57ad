"""Write the README's tool reference from the tool schemas (the one source of truth).

.venv/bin/python scripts/gen_tool_reference.py          # rewrite README.md in place
.venv/bin/python scripts/gen_tool_reference.py --check  # exit 1 if README.md is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from iris_rag.schemas import SCHEMA_DIR, tool_specs

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- tools:start -->", "<!-- tools:end -->"
# Every free-text argument's pattern (a query's, a topic's): written out, it would crowd each table.
NOT_BLANK = json.loads((SCHEMA_DIR / "common.json").read_text(encoding="utf-8"))["$defs"]["query"]["pattern"]


def _type(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_type(schema['items'])}"
    return kind


def _limits(schema: dict[str, Any]) -> str:
    parts = []
    for key, label in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("maxProperties", "keys ≤"),
        ("maxDepth", "depth ≤"),
    ):
        if key in schema:
            parts.append(f"{label} {schema[key]}")
    if schema.get("uniqueItems"):
        parts.append("unique")
    if schema.get("pattern") == NOT_BLANK:
        parts.append("not only whitespace")
    elif "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    items = schema.get("items")
    # An array of objects gets a row per field; one of scalars says its items' limits here.
    if isinstance(items, dict) and not items.get("properties") and (each := _limits(items)):
        parts.append(f"each: {each}")
    if "default" in schema:
        parts.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(parts)


def _rows(properties: dict[str, Any], required: set[str], prefix: str = "") -> list[str]:
    rows = []
    for name, schema in properties.items():
        label = f"`{prefix}{name}`" + (" (required)" if name in required else "")
        description = schema.get("description", "").replace("|", "\\|")
        rows.append(f"| {label} | {_type(schema)} | {_limits(schema)} | {description} |")
        if schema.get("type") == "object" and schema.get("properties"):
            rows += _rows(schema["properties"], set(schema.get("required", [])), f"{prefix}{name}.")
        items = schema.get("items")
        if isinstance(items, dict) and items.get("properties"):
            rows += _rows(items["properties"], set(items.get("required", [])), f"{prefix}{name}[].")
    return rows


def reference() -> str:
    """The markdown for every tool."""
    sections = []
    for spec in tool_specs():
        # A tool that sets no hint (it writes, adds, never deletes) says so, rather than an empty list.
        hints = ", ".join(k for k, v in spec["annotations"].items() if v is True) or "none"
        schema = spec["inputSchema"]
        rows = _rows(schema.get("properties", {}), set(schema.get("required", [])))
        table = (
            ["| argument | type | limits | meaning |", "|---|---|---|---|", *rows]
            if rows
            else ["(no arguments)"]
        )
        outputs = ", ".join(f"`{k}`" for k in spec["outputSchema"].get("properties", {}))
        sections.append(
            "\n".join(
                [
                    f"### `{spec['name']}`: {spec['title']}",
                    "",
                    spec["description"],
                    "",
                    f"Annotations: {hints}.",
                    "",
                    *table,
                    "",
                    f"Returns: {outputs}.",
                ]
            )
        )
    return "\n\n".join(sections)


def main() -> None:
    """Rewrite or check the generated part of README.md."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = README.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    updated = f"{head}{START}\n{reference()}\n{END}{tail}"
    if args.check:
        if updated != text:
            print("README.md's tool reference is stale: run scripts/gen_tool_reference.py", file=sys.stderr)
            sys.exit(1)
        return
    README.write_text(updated, encoding="utf-8")


if __name__ == "__main__":
    main()

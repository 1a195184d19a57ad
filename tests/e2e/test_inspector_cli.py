"""Drive the built server with the MCP Inspector's CLI mode (`mcp-inspector --cli`), as a developer would."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

TIMEOUT_S = 120
Inspector = Callable[..., Any]


@pytest.fixture(scope="module")
def inspector(repo_root: Path, server_entry: Path, server_env: dict[str, str]) -> Inspector:
    """Run one inspector CLI call against `node mcp-server/dist/index.js` and return its JSON output."""

    def run(*method_args: str) -> Any:
        command = ["npx", "--no-install", "mcp-inspector", "--cli", "node", str(server_entry), *method_args]
        completed = subprocess.run(
            command,
            cwd=repo_root,
            env=server_env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert completed.returncode == 0, (
            f"{' '.join(command)} failed:\n{completed.stdout}\n{completed.stderr}"
        )
        return json.loads(completed.stdout)

    return run


def test_tools_list(inspector: Inspector) -> None:
    listed = inspector("--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert {"rag_basic", "rag_ingest", "rag_list_collections", "rag_health_check"} <= set(tools)
    assert all("inputSchema" in tool and "outputSchema" in tool for tool in tools.values())


def test_tools_call_list_collections_sees_an_ingested_collection(inspector: Inspector) -> None:
    documents = [{"id": "cli-1", "content": "The inspector CLI ingested this document."}]
    ingested = inspector(
        "--method",
        "tools/call",
        "--tool-name",
        "rag_ingest",
        "--tool-arg",
        "collection_id=cli",
        f"documents={json.dumps(documents)}",
    )
    assert not ingested.get("isError"), ingested
    assert ingested["structuredContent"]["document_ids"] == ["cli-1"]

    listed = inspector("--method", "tools/call", "--tool-name", "rag_list_collections")
    assert not listed.get("isError"), listed
    collections = {c["id"]: c for c in listed["structuredContent"]["collections"]}
    assert collections["cli"]["document_count"] == 1
    assert json.loads(listed["content"][0]["text"]) == listed["structuredContent"]

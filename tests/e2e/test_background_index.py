"""INDEX_BUILD=background through the real MCP server: the ingest returns before the technique indexes,
a technique answers meanwhile from what is indexed and says so, and rag_health_check shows the build."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from tests.conftest import SAMPLE_CORPUS
from tests.e2e.conftest import INITIALIZE_TIMEOUT_S
from tests.e2e.mcp_harness import result_json

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TECHNIQUES = ["colbert", "graphrag", "noderag"]
QUERY = "What does vitamin D do in tuberculosis?"


def _documents(count: int) -> list[dict[str, Any]]:
    with SAMPLE_CORPUS.open(encoding="utf-8") as lines:
        records = [json.loads(line) for _, line in zip(range(count), lines, strict=False)]
    return [{"id": str(r["_id"]), "title": r.get("title", ""), "content": r["text"]} for r in records]


@pytest.fixture(scope="module")
async def background_session(
    repo_root: Path, server_entry: Path, server_env: dict[str, str]
) -> AsyncIterator[ClientSession]:
    env = {**server_env, "INDEX_BUILD": "background", "RAG_TECHNIQUES": ",".join(["basic", *TECHNIQUES])}
    params = StdioServerParameters(command="node", args=[str(server_entry)], env=env, cwd=repo_root)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(INITIALIZE_TIMEOUT_S):
            await client.initialize()
        yield client


async def _call(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    with anyio.fail_after(300):
        result = await session.call_tool(tool, arguments)
    body = result_json(result)
    assert not result.isError, body
    return body


async def _index_states(session: ClientSession, collection_id: str) -> dict[str, dict[str, Any]]:
    health = await _call(session, "rag_health_check", {"include_details": True})
    build = health["components"]["vector_store"]["details"]["index_build"]
    assert build["mode"] == "background"
    states: dict[str, dict[str, Any]] = build["collections"][collection_id]
    return states


async def test_ingest_returns_first_and_techniques_say_what_is_not_indexed_yet(
    background_session: ClientSession,
) -> None:
    documents = _documents(40)
    ingested = await _call(background_session, "rag_ingest", {"collection_id": "bg", "documents": documents})
    assert ingested["ingested_count"] == 40
    assert ingested["indexes_building"] == TECHNIQUES

    # The core is searchable at once; NodeRAG (whose index is built last of the three) answers from what
    # it has indexed, which is nothing yet, and says so.
    basic = await _call(background_session, "rag_basic", {"query": QUERY, "collection_id": "bg"})
    assert basic["retrieved_documents"]
    assert "index_build" not in basic["metadata"]["technique_specific"]
    with anyio.fail_after(300):
        result = await background_session.call_tool("rag_noderag", {"query": QUERY, "collection_id": "bg"})
    noderag = result_json(result)
    note = noderag["metadata"]["technique_specific"]["index_build"]
    # The text a client's model reads says it too, not only structuredContent.
    assert isinstance(result.content[0], TextContent) and result.content[0].text.endswith(
        f"Note: {note['note']}"
    )
    assert note["state"] == "building" and note["documents"] == 40
    assert note["missing_documents"] == 40 - note["indexed_documents"] > 0
    assert f"covered {note['indexed_documents']} of 40 documents" in note["note"]
    states = await _index_states(background_session, "bg")
    assert states["noderag"]["state"] == "building" and states["noderag"]["indexed_documents"] < 40

    # Then every index is built, and the same call searches all of it, with no note.
    with anyio.fail_after(600):
        while {s["state"] for s in (await _index_states(background_session, "bg")).values()} != {"ready"}:
            await anyio.sleep(1)
    states = await _index_states(background_session, "bg")
    assert {t: (s["indexed_documents"], s["documents"]) for t, s in states.items()} == dict.fromkeys(
        TECHNIQUES, (40, 40)
    )
    for technique in TECHNIQUES:
        answer = await _call(background_session, f"rag_{technique}", {"query": QUERY, "collection_id": "bg"})
        assert answer["retrieved_documents"]
        assert "index_build" not in answer["metadata"]["technique_specific"]

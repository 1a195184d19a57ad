"""Drive `node mcp-server/dist/index.js` with the official MCP Python client, as an MCP host would."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest
from mcp import ClientSession, McpError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent

from iris_rag.schemas import tool_specs
from tests.e2e.mcp_harness import result_json

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# The server must list exactly the tools the schema files define (the one source of truth).
EXPECTED_TOOLS = {spec["name"] for spec in tool_specs()}
DOCUMENTS = [
    {
        "id": "seine",
        "title": "Paris",
        "content": "Paris is the capital of France. The river Seine flows through the city.",
    },
    {
        "id": "photosynthesis",
        "title": "Plants",
        "content": "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar.",
    },
    {
        "id": "python",
        "title": "Python",
        "content": "Python is a programming language known for its readable syntax.",
    },
]
# Every technique the server serves, each checked end to end below.
TECHNIQUE_TOOLS = {spec["name"] for spec in tool_specs() if "technique" in spec["bridge"]}
CALL_TIMEOUT_S = 120  # the first ingest also loads the embedding model


async def call(
    session: ClientSession, name: str, arguments: dict[str, Any]
) -> tuple[CallToolResult, dict[str, Any]]:
    """Call a tool; return the result and its JSON (structuredContent, or the error in the text)."""
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(name, arguments)
    assert len(result.content) == 1
    assert isinstance(result.content[0], TextContent)
    return result, result_json(result)


async def test_lists_every_tool_with_its_schemas(session: ClientSession) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(tools) == EXPECTED_TOOLS
    for tool in tools.values():
        assert tool.inputSchema["type"] == "object"
        assert tool.outputSchema is not None and tool.outputSchema["type"] == "object"
        assert tool.annotations is not None and tool.annotations.readOnlyHint is not None
        assert tool.description
    assert tools["rag_basic"].inputSchema["required"] == ["query"]
    ingest_annotations = tools["rag_ingest"].annotations
    assert ingest_annotations is not None and ingest_annotations.readOnlyHint is False


async def test_ingests_then_answers_from_the_ingested_documents(session: ClientSession) -> None:
    ingested, body = await call(session, "rag_ingest", {"collection_id": "e2e", "documents": DOCUMENTS})
    assert not ingested.isError, body
    assert body["ingested_count"] == 3
    assert sorted(body["document_ids"]) == sorted(doc["id"] for doc in DOCUMENTS)
    assert body["errors"] == []

    query = {"query": "Which river flows through Paris?", "collection_id": "e2e", "options": {"top_k": 2}}
    result, answer = await call(session, "rag_basic", query)
    assert not result.isError, answer
    assert answer["success"] is True
    assert answer["technique"] == "basic"
    retrieved = answer["retrieved_documents"]
    assert 1 <= len(retrieved) <= 2
    assert {doc["id"] for doc in retrieved} <= {doc["id"] for doc in DOCUMENTS}
    assert retrieved[0]["id"] == "seine"
    assert answer["metadata"]["collection_id"] == "e2e"


@pytest.mark.parametrize("tool", sorted(TECHNIQUE_TOOLS))
async def test_every_technique_answers_through_mcp(session: ClientSession, tool: str) -> None:
    await call(session, "rag_ingest", {"collection_id": "e2e", "documents": DOCUMENTS})
    arguments = {"query": "Which river flows through Paris?", "collection_id": "e2e", "options": {"top_k": 2}}
    result, answer = await call(session, tool, arguments)
    assert not result.isError, answer
    assert answer["technique"] == tool.removeprefix("rag_")
    assert answer["retrieved_documents"][0]["id"] == "seine"
    assert "[1]" in answer["answer"]
    evidence, body = await call(session, tool, {**arguments, "options": {"generate": False}})
    assert not evidence.isError and body["answer"] is None


async def test_tool_list_fits_a_small_budget_and_says_which_tool_to_start_with(
    session: ClientSession, server_instructions: str
) -> None:
    listed = await session.list_tools()
    size = len(listed.model_dump_json(by_alias=True, exclude_none=True))
    assert size < 24_000, f"tools/list is {size} characters"
    assert "Start with rag_hybrid_ifind" in server_instructions
    hyde = next(tool for tool in listed.tools if tool.name == "rag_hyde")
    assert hyde.description is not None
    # Issue 17: the description says what the no-LLM default is: feedback from a hybrid first pass.
    assert "Without an LLM, the query mixed with the vector of rag_hybrid_ifind's top passage" in (
        hyde.description
    )


async def test_a_technique_result_reads_as_answer_and_numbered_sources(session: ClientSession) -> None:
    await call(session, "rag_ingest", {"collection_id": "e2e", "documents": DOCUMENTS})
    query = {"query": "Which river flows through Paris?", "collection_id": "e2e", "options": {"top_k": 5}}
    result, answer = await call(session, "rag_hybrid_ifind", query)
    text = result.content[0]
    assert isinstance(text, TextContent) and not result.isError
    assert text.text.startswith(answer["answer"])
    assert "\n[1] Paris | document seine | chunks seine#0 | score " in text.text
    # What the model reads is about a third of the JSON; the whole result stays in structuredContent.
    assert len(text.text) < len(json.dumps(answer)) / 2


async def test_invalid_arguments_are_rejected_with_invalid_parameters(session: ClientSession) -> None:
    arguments = {"query": "Paris?", "collection_id": "e2e", "options": {"top_k": 0}}
    result, body = await call(session, "rag_basic", arguments)
    assert result.isError
    assert body["success"] is False
    assert body["error"]["code"] == "INVALID_PARAMETERS"
    assert "top_k" in body["error"]["message"]
    assert body["hint"]


async def test_blank_query_is_rejected_with_invalid_query(session: ClientSession) -> None:
    result, body = await call(session, "rag_basic", {"query": "   "})
    assert result.isError
    assert body["error"]["code"] == "INVALID_QUERY"


async def test_unknown_tool_is_an_invalid_params_protocol_error(session: ClientSession) -> None:
    """MCP 2025-06-18, tools, Error Handling: an unknown tool is a JSON-RPC error, not a tool result."""
    with anyio.fail_after(CALL_TIMEOUT_S), pytest.raises(McpError) as raised:
        await session.call_tool("rag_does_not_exist", {})
    assert raised.value.error.code == INVALID_PARAMS
    assert "Unknown tool: rag_does_not_exist" in raised.value.error.message


async def test_health_check_reports_a_reachable_worker(session: ClientSession) -> None:
    result, health = await call(session, "rag_health_check", {})
    assert not result.isError, health
    assert result.structuredContent == health
    assert health["status"] in {"healthy", "degraded"}
    assert health["components"]["python_bridge"]["status"] == "healthy"


async def test_documents_are_listed_and_deleted_through_mcp(session: ClientSession) -> None:
    await call(session, "rag_ingest", {"collection_id": "managed", "documents": DOCUMENTS})
    listed_result, listed = await call(
        session, "rag_list_documents", {"collection_id": "managed", "limit": 2}
    )
    assert not listed_result.isError, listed
    assert [d["id"] for d in listed["documents"]] == ["seine", "photosynthesis"] and listed[
        "next_cursor"
    ] == "2"
    deleted_result, deleted = await call(
        session, "rag_delete_documents", {"collection_id": "managed", "document_ids": ["seine"]}
    )
    assert not deleted_result.isError and deleted["deleted_ids"] == ["seine"], deleted
    query = {"query": "Which river flows through Paris?", "collection_id": "managed", "options": {"top_k": 3}}
    _, answer = await call(session, "rag_basic", query)
    assert "seine" not in {d["id"] for d in answer["retrieved_documents"]}
    refused, error = await call(session, "rag_delete_documents", {"collection_id": "managed", "filter": {}})
    assert refused.isError and error["error"]["code"] == "INVALID_PARAMETERS", error


async def test_a_collection_is_deleted_through_mcp_when_named_twice(session: ClientSession) -> None:
    await call(session, "rag_ingest", {"collection_id": "doomed", "documents": DOCUMENTS})
    refused, error = await call(
        session, "rag_delete_collection", {"collection_id": "doomed", "confirm_collection_id": "doome"}
    )
    assert refused.isError and error["error"]["code"] == "INVALID_PARAMETERS", error
    deleted_result, deleted = await call(
        session, "rag_delete_collection", {"collection_id": "doomed", "confirm_collection_id": "doomed"}
    )
    assert not deleted_result.isError and deleted["documents_deleted"] == 3, deleted
    _, listed = await call(session, "rag_list_collections", {})
    assert "doomed" not in {c["id"] for c in listed["collections"]}
    gone, answer = await call(session, "rag_basic", {"query": "Paris", "collection_id": "doomed"})
    assert gone.isError and answer["error"]["code"] == "COLLECTION_NOT_FOUND"


async def test_ranking_and_reasoning_steps_through_mcp(session: ClientSession) -> None:
    """options.ranking reorders by the weighted 4R score; options.cot_steps shows the evidence chain."""
    dated = [
        {**DOCUMENTS[0], "metadata": {"date": "1990-01-01"}},
        {
            "id": "seine-news",
            "title": "Seine news",
            "content": "A new footbridge over the Seine opened in Paris this month.",
            "metadata": {"date": datetime.now(UTC).date().isoformat()},
        },
    ]
    await call(session, "rag_ingest", {"collection_id": "e2e-ranked", "documents": dated})
    query = {"query": "Which river flows through Paris?", "collection_id": "e2e-ranked"}
    plain, body = await call(session, "rag_basic", {**query, "options": {"top_k": 1}})
    assert not plain.isError and body["retrieved_documents"][0]["id"] == "seine"
    options = {"top_k": 1, "cot_steps": True, "ranking": {"relevancy": 0.2, "recency": 0.8}}
    result, answer = await call(session, "rag_basic", {**query, "options": options})
    assert not result.isError, answer
    (first,) = answer["retrieved_documents"]
    assert first["id"] == "seine-news"
    assert set(first["score_details"]["ranking"]) >= {
        "relevancy",
        "recency",
        "richness",
        "reputation",
        "overall",
    }
    assert answer["cot_steps"]["source"] == "extractive"
    text = result.content[0]
    assert isinstance(text, TextContent)
    assert "\n\nSteps (extractive evidence chain, not model reasoning):\n1. " in text.text
    assert "{seine-news#0}" in text.text
    bad, error = await call(session, "rag_basic", {**query, "options": {"ranking": {"relevancy": 0}}})
    assert bad.isError and error["error"]["code"] == "INVALID_PARAMETERS"
    assert "every weight is 0" in error["error"]["message"]

"""Issue 16's spec items through the real MCP server and the official client: an embedding API in place of
the local model, request_id/session_id echoed and listed, and the spec's error codes from real causes.

The embedding endpoint is FakeOpenAIServer (a test double for a hosted API); everything else is real.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult

from tests.e2e.mcp_harness import result_json
from tests.fake_openai import FakeOpenAIServer

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CALL_TIMEOUT_S = 120
DOCUMENTS = [
    {
        "id": "seine",
        "title": "Paris",
        "content": "Paris is the capital of France. The Seine flows through it.",
    },
    {
        "id": "plants",
        "title": "Plants",
        "content": "Photosynthesis turns sunlight, water and CO2 into sugar.",
    },
]

Connect = Callable[[dict[str, str]], AbstractAsyncContextManager[ClientSession]]


@pytest.fixture
def connect(repo_root: Path, server_entry: Path, server_env: dict[str, str], tmp_path: Path) -> Connect:
    """Start the real server (on its own empty store) with extra environment and an initialized session."""

    @asynccontextmanager
    async def session(extra_env: dict[str, str]) -> AsyncIterator[ClientSession]:
        env = {**server_env, "RAG_DATA_DIR": str(tmp_path / "data"), **extra_env}
        params = StdioServerParameters(command="node", args=[str(server_entry)], env=env, cwd=repo_root)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            with anyio.fail_after(60):
                await client.initialize()
            yield client

    return session


@pytest.fixture
def endpoint() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    yield server
    server.close()


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> tuple[CallToolResult, Any]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(name, arguments)
    return result, result_json(result)


async def test_embedding_api_with_correlation_ids_end_to_end(
    connect: Connect, endpoint: FakeOpenAIServer
) -> None:
    env = {
        "RAG_STORE": "sqlite",
        **endpoint.embedding_env(),
        "RAG_TECHNIQUES": "basic,hybrid_ifind,hyde",
    }
    async with connect(env) as session:
        ids = {"request_id": "req-ingest", "session_id": "sess-1"}
        ingested, body = await call(
            session, "rag_ingest", {"collection_id": "e2e", "documents": DOCUMENTS, **ids}
        )
        assert not ingested.isError, body
        assert (body["request_id"], body["session_id"]) == ("req-ingest", "sess-1")

        query = {"query": "Which river flows through Paris?", "collection_id": "e2e"}
        answered, answer = await call(
            session, "rag_basic", {**query, "request_id": "req-q", "session_id": "sess-1"}
        )
        assert not answered.isError, answer
        assert answer["retrieved_documents"][0]["id"] == "seine"
        assert answer["metadata"]["model_info"]["embedding_model"] == "openai:fake-embedder"
        assert (answer["request_id"], answer["session_id"]) == ("req-q", "sess-1")

        # Refused by the front end's validation: the spec's code, the ids echoed, the call recorded with them.
        refused, error = await call(session, "rag_basic", {"collection_id": "e2e", "request_id": "req-bad"})
        assert refused.isError and error["error"]["code"] == "MISSING_REQUIRED_FIELD", error
        assert error["error"]["details"]["request_id"] == "req-bad"

        _, metrics = await call(session, "rag_metrics", {"session_id": "sess-1"})
        assert metrics["session_id"] == "sess-1"
        recent = {c["request_id"]: c for c in metrics["recent_calls"]}
        assert recent["req-ingest"]["tool"] == "rag_ingest" and recent["req-ingest"]["session_id"] == "sess-1"
        assert recent["req-q"]["tool"] == "rag_basic" and recent["req-q"]["success"] is True
        assert recent["req-bad"]["error_code"] == "MISSING_REQUIRED_FIELD"
        assert metrics["by_tool"]["rag_basic"]["last_execution_time"]

        # rag_colbert is not served here (RAG_TECHNIQUES), and the listing leaves the ids out.
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert "rag_colbert" not in tools
        assert all("request_id" not in tool.inputSchema.get("properties", {}) for tool in tools.values())

        endpoint.status = 500  # the endpoint fails: the spec's code, the key masked
        failed, error = await call(
            session, "rag_basic", {"query": "sunlight and sugar", "collection_id": "e2e"}
        )
        assert failed.isError and error["error"]["code"] == "EMBEDDING_SERVICE_UNAVAILABLE", error
        assert "sk-e2e-embedding-key" not in str(error)


async def test_an_unreachable_database_is_database_connection_failed(connect: Connect) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://rag:e2e-db-secret@127.0.0.1:{port}/rag"
    async with connect({"RAG_STORE": "postgres", "RAG_POSTGRES_URL": url}) as session:
        failed, error = await call(session, "rag_list_collections", {"request_id": "r-db"})
        assert failed.isError and error["error"]["code"] == "DATABASE_CONNECTION_FAILED", error
        assert error["error"]["details"]["request_id"] == "r-db"
        assert "e2e-db-secret" not in str(error)
        _, health = await call(session, "rag_health_check", {})
        assert health["status"] == "unhealthy"
        assert "DATABASE_CONNECTION_FAILED" in health["components"]["python_bridge"]["error_message"]

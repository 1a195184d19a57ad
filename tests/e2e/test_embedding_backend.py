"""EMBEDDING_BACKEND through the real MCP server: the health check names the backend serving encodes, and
rag_basic ranks a collection the same under onnx and torch (one ingested under onnx, queried under both)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.e2e.mcp_harness import result_json

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CALL_TIMEOUT_S = 240
DOCUMENTS = [
    {"id": "insulin", "content": "Insulin resistance in skeletal muscle precedes type 2 diabetes."},
    {"id": "aspirin", "content": "Low-dose aspirin lowers the risk of a first heart attack in older adults."},
    {"id": "sleep", "content": "Short sleep is associated with weight gain and impaired glucose tolerance."},
    {"id": "vitamin", "content": "Vitamin D supplements did not prevent fractures in the randomized trial."},
]
QUERY = "Does insulin resistance lead to diabetes?"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def _server(
    repo_root: Path, server_entry: Path, env: dict[str, str], backend: str
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command="node",
        args=[str(server_entry)],
        env={**env, "EMBEDDING_BACKEND": backend, "RAG_TECHNIQUES": "basic"},
        cwd=repo_root,
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(120):
            await client.initialize()
        yield client


async def _call(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(name, arguments)
    assert not result.isError, result.content
    return result_json(result)


async def _ranking_and_backend(session: ClientSession) -> tuple[list[tuple[str, float]], str]:
    answer = await _call(session, "rag_basic", {"query": QUERY, "collection_id": "backends"})
    ranking = [(d["id"], float(d["similarity_score"])) for d in answer["retrieved_documents"]]
    health = await _call(session, "rag_health_check", {"include_details": True})
    return ranking, health["components"]["embedding_service"]["details"]["backend"]


async def test_onnx_and_torch_serve_the_same_ranking(
    repo_root: Path, server_entry: Path, server_env: dict[str, str]
) -> None:
    async with _server(repo_root, server_entry, server_env, "onnx") as session:
        ingested = await _call(session, "rag_ingest", {"collection_id": "backends", "documents": DOCUMENTS})
        assert ingested["ingested_count"] == len(DOCUMENTS)
        under_onnx, backend = await _ranking_and_backend(session)
        assert backend == "onnx"
    async with _server(repo_root, server_entry, server_env, "torch") as session:
        under_torch, backend = await _ranking_and_backend(session)
        assert backend == "torch"
    assert under_onnx[0][0] == "insulin"
    assert [doc for doc, _ in under_onnx] == [doc for doc, _ in under_torch]
    for (_, onnx_score), (_, torch_score) in zip(under_onnx, under_torch, strict=True):
        assert abs(onnx_score - torch_score) < 1e-4

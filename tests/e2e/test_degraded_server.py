"""The server through the official MCP client when calls time out, the queue is full, the worker cannot
start, or only some techniques are served: every failure is answered, explained and counted once."""

from __future__ import annotations

import stat
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent

from iris_rag.schemas import tool_specs
from tests.e2e.mcp_harness import result_json
from tests.fake_openai import FakeOpenAIServer

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CALL_TIMEOUT_S = 240
SLOW_INGEST = {
    "collection_id": "slow",
    "documents": [
        {"id": f"doc-{i}", "content": f"Document {i}. Retrieval grounds answers in text."} for i in range(3)
    ],
}


Connect = Callable[[dict[str, str]], AbstractAsyncContextManager[ClientSession]]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


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


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> tuple[CallToolResult, Any]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(name, arguments)
    assert isinstance(result.content[0], TextContent)
    return result, result_json(result)


@pytest.fixture
def stalling_endpoint() -> Iterator[FakeOpenAIServer]:
    """The hosted embedding API's test double, holding the slow ingest's embedding call for 4 s."""
    endpoint = FakeOpenAIServer()
    endpoint.on_request = lambda body: (
        time.sleep(4) if "Retrieval grounds" in str(body.get("input")) else None
    )
    yield endpoint
    endpoint.close()


async def test_time_outs_refusals_and_unknown_tools_are_each_recorded_once(
    connect: Connect, stalling_endpoint: FakeOpenAIServer
) -> None:
    # The ingest's embedding call stalls: a silent stretch well past the 1.5 s limit on any machine. (A slow
    # local encode was the stretch before: on a quiet machine the ingest finished first, with progress.)
    endpoint = stalling_endpoint
    limits = {
        "REQUEST_TIMEOUT_MS": "1500",
        "MAX_CONCURRENT_REQUESTS": "1",
        "MAX_QUEUED_REQUESTS": "0",
        **endpoint.embedding_env(),
        "RAG_TECHNIQUES": "basic",
    }
    async with connect(limits) as session:
        async with anyio.create_task_group() as tasks:
            outcomes: dict[str, Any] = {}

            async def ingest() -> None:
                outcomes["ingest"] = await call(session, "rag_ingest", SLOW_INGEST)

            tasks.start_soon(ingest)
            await anyio.sleep(0.5)
            # The queue is full (MAX_QUEUED_REQUESTS=0): refused, and the refusal recorded nonetheless.
            refused, body = await call(session, "rag_basic", {"query": "q", "collection_id": "slow"})
            assert refused.isError and body["error"]["code"] == "RATE_LIMIT_EXCEEDED"
        timed_out, body = outcomes["ingest"]
        assert timed_out.isError and body["error"]["code"] == "TIMEOUT_EXCEEDED"
        with pytest.raises(McpError):  # an unknown tool is a protocol error (-32602), recorded all the same
            await call(session, "rag_no_such_tool", {})

        # The worker goes on with the timed-out ingest until it stops it: wait until it has.
        with anyio.fail_after(CALL_TIMEOUT_S):
            while True:
                result, metrics = await call(session, "rag_metrics", {"time_range": "1h"})
                if not result.isError and "rag_ingest" in metrics["by_tool"]:
                    break
                await anyio.sleep(0.5)
        by_tool = metrics["by_tool"]
        assert by_tool["rag_ingest"]["request_count"] == 1, "a time-out is not also a success"
        assert by_tool["rag_ingest"]["error_codes"] == {"TIMEOUT_EXCEEDED": 1}
        assert by_tool["rag_basic"]["error_codes"] == {"RATE_LIMIT_EXCEEDED": 1}
        # Under one name: a client's names for tools that do not exist add no by_tool entries.
        assert by_tool["(unknown tool)"]["error_codes"] == {"PIPELINE_NOT_FOUND": 1}
        assert "rag_no_such_tool" not in by_tool


async def test_a_worker_that_cannot_start_still_lists_tools_and_says_why(
    connect: Connect, tmp_path: Path
) -> None:
    # A Python without the project's packages: -S leaves out site-packages, so numpy is missing.
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(bare.stat().st_mode | stat.S_IXUSR)
    async with connect({"IRIS_RAG_PYTHON": str(bare)}) as session:
        with anyio.fail_after(30):
            tools = {tool.name for tool in (await session.list_tools()).tools}
        assert tools == {spec["name"] for spec in tool_specs()}

        health, body = await call(session, "rag_health_check", {})
        assert not health.isError
        assert body["status"] == "unhealthy"
        bridge = body["components"]["python_bridge"]
        assert "No module named" in bridge["error_message"], bridge

        failed, body = await call(session, "rag_basic", {"query": "q"})
        assert failed.isError
        assert body["error"]["code"] == "WORKER_UNAVAILABLE"
        assert "No module named" in body["error"]["message"]
        assert "retry" not in body["hint"].lower(), "a start-up failure is not fixed by a retry"


async def test_only_served_tools_are_listed(connect: Connect) -> None:
    async with connect({"RAG_TECHNIQUES": "basic"}) as session:
        tools = {tool.name for tool in (await session.list_tools()).tools}
        for hidden in (
            "rag_graph_explore",
            "rag_ingest_table",
            "rag_table_schema",
            "rag_graphrag",
            "rag_sqlrag",
        ):
            assert hidden not in tools
        assert {"rag_basic", "rag_ingest", "rag_health_check"} <= tools
        with pytest.raises(McpError) as raised:
            await call(session, "rag_graph_explore", {"entity": "TNF"})
        assert raised.value.error.code == INVALID_PARAMS
        assert "Unknown tool: rag_graph_explore" in raised.value.error.message

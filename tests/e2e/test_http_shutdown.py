"""SIGTERM to the HTTP service (MCP_TRANSPORT=http) while calls run: every call still in progress gets an
answer (REQUEST_CANCELLED, the server is shutting down) before the streams close, and the server exits
promptly."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest
from mcp.types import CallToolResult

from tests.e2e.mcp_harness import result_json
from tests.e2e.paced import SLOW_DOCUMENTS
from tests.e2e.test_http_server import KEYS, connect, paced_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_sigterm_answers_the_calls_in_progress_before_it_exits(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], tmp_path: Path
) -> None:
    # One slot: the first ingest runs in the worker, the second waits in the front end's queue.
    with paced_server(
        repo_root, server_entry, server_env, tmp_path, {"MAX_CONCURRENT_REQUESTS": "1"}
    ) as server:
        results: dict[str, CallToolResult] = {}
        running = anyio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            running.set()

        async with connect(server, KEYS["admin"]) as client:

            async def ingest(collection: str) -> None:
                results[collection] = await client.call_tool(
                    "rag_ingest",
                    {"collection_id": collection, "documents": SLOW_DOCUMENTS},
                    progress_callback=on_progress if collection == "running" else None,
                )

            async with anyio.create_task_group() as group:
                group.start_soon(ingest, "running")
                with anyio.fail_after(120):
                    await running.wait()
                group.start_soon(ingest, "queued")
                await anyio.sleep(0.5)  # the second call reaches the server and queues behind the first
                signalled = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                # Before the fix both calls got an empty SSE body and the official client waited for ever.
                with anyio.fail_after(20):
                    while len(results) < 2:
                        await anyio.sleep(0.05)
            answered_s = time.monotonic() - signalled
            assert server.process.wait(20) == 0
            exited_s = time.monotonic() - signalled
        for collection, result in results.items():
            body = result_json(result)
            assert result.isError, (collection, body)
            assert body["error"]["code"] == "REQUEST_CANCELLED", (collection, body)
            assert "shutting down" in body["error"]["message"], (collection, body)
        assert answered_s < 10 and exited_s < 12, (answered_s, exited_s)

"""What one API key may spend over HTTP: requests_per_minute covers resources and new sessions as well as
tools/call, and MCP_MAX_SESSIONS_PER_KEY bounds the sessions a key holds open (each kept in memory): past
it the key's least recently used session is closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import McpError
from pydantic import AnyUrl

from tests.e2e.test_http_server import (
    _ACCEPT,
    KEYS,
    HttpServer,
    _initialize_body,
    call,
    connect,
    keyed_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MAX_SESSIONS = 3


@pytest.fixture(scope="module")
def limits_server(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpServer]:
    # KEYS' "limited" has requests_per_minute 3.
    settings = {"MCP_MAX_SESSIONS_PER_KEY": str(MAX_SESSIONS)}
    with keyed_server(
        repo_root, server_entry, server_env, tmp_path_factory.mktemp("auth"), settings
    ) as server:
        yield server


async def test_resources_and_initialize_spend_the_keys_bucket(limits_server: HttpServer) -> None:
    async with connect(limits_server, KEYS["limited"]) as client:
        refused = False
        for _ in range(4):  # a burst of 3 at most: the 4th call at the latest is refused
            failed, body = await call(client, "rag_list_collections", {})
            if failed:
                assert body["error"]["code"] == "RATE_LIMIT_EXCEEDED", body
                refused = True
                break
        assert refused
        # The same worker reads through resources are refused too, not served 50 times over.
        for read in (
            lambda: client.read_resource(AnyUrl("rag://collections")),
            lambda: client.read_resource(AnyUrl("rag://collection/papers/documents")),
            client.list_resources,
        ):
            with anyio.fail_after(60), pytest.raises(McpError) as raised:
                await read()
            assert "RATE_LIMIT_EXCEEDED" in raised.value.error.message
        # Lightweight protocol requests are not throttled.
        assert (await client.list_tools()).tools
        await client.send_ping()
    async with httpx.AsyncClient(timeout=30) as http:
        opened = await http.post(
            limits_server.mcp,
            json=_initialize_body(),
            headers={**_ACCEPT, "Authorization": f"Bearer {KEYS['limited']}"},
        )
    assert opened.status_code == 429
    assert "RATE_LIMIT_EXCEEDED" in opened.json()["error"]["message"]
    assert int(opened.headers["retry-after"]) >= 1


async def test_a_key_holds_only_so_many_sessions(limits_server: HttpServer) -> None:
    """Past the cap, opening a session closes the key's least recently used one: memory stays bounded and a
    client that leaks a session per run keeps working."""
    headers = {**_ACCEPT, "Authorization": f"Bearer {KEYS['bob']}"}

    async def ping(http: httpx.AsyncClient, session: str, key_headers: dict[str, str]) -> int:
        body = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
        answer = await http.post(
            limits_server.mcp, json=body, headers={**key_headers, "mcp-session-id": session}
        )
        return answer.status_code

    async with httpx.AsyncClient(timeout=30) as http:
        carol_headers = {**_ACCEPT, "X-API-Key": KEYS["carol"]}
        carol = await http.post(limits_server.mcp, json=_initialize_body(), headers=carol_headers)
        assert carol.status_code == 200
        sessions = []
        for _ in range(MAX_SESSIONS + 5):
            opened = await http.post(limits_server.mcp, json=_initialize_body(), headers=headers)
            assert opened.status_code == 200
            sessions.append(opened.headers["mcp-session-id"])
            if len(sessions) == 2:
                assert await ping(http, sessions[0], headers) == 200  # the first is now used after the second
            if len(sessions) == MAX_SESSIONS + 1:  # the second was the least recently used, not the first
                assert (await ping(http, sessions[1], headers), await ping(http, sessions[0], headers)) == (
                    404,
                    200,
                )
        health = await http.get(f"{limits_server.url}/health")
        assert health.json()["sessions"] <= MAX_SESSIONS + 2  # bob's, carol's, and at most one other test's
        alive = [session for session in sessions if await ping(http, session, headers) == 200]
        assert alive == sessions[-MAX_SESSIONS:], "the least recently used are closed first"
        assert await ping(http, carol.headers["mcp-session-id"], carol_headers) == 200, (
            "another key's is kept"
        )


async def test_a_burst_of_health_probes_asks_the_worker_once(limits_server: HttpServer) -> None:
    """GET /health needs no key: a burst of probes (a load balancer, or anyone) costs the worker one check."""

    async def checks_recorded(admin: Any) -> int:
        failed, metrics = await call(admin, "rag_metrics", {"time_range": "1h"})
        assert not failed, metrics
        return int(metrics["by_tool"].get("rag_health_check", {}).get("request_count", 0))

    async with connect(limits_server, KEYS["admin"]) as admin:
        before = await checks_recorded(admin)
        async with httpx.AsyncClient(timeout=30) as http:
            answers = await asyncio.gather(*(http.get(f"{limits_server.url}/health") for _ in range(30)))
        assert {answer.status_code for answer in answers} == {200}
        assert all(answer.json()["status"] in ("healthy", "degraded") for answer in answers)
        await anyio.sleep(1.5)  # the monitor stores call records in the background
        assert await checks_recorded(admin) - before <= 2, "one check, or two across a second's boundary"

"""The server as a shared HTTP service (MCP_TRANSPORT=http): the official client's Streamable HTTP transport,
API keys from RAG_AUTH_FILE, collection grants, Origin and body-size refusals, key rotation, rate limits."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, McpError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent
from pydantic import AnyUrl

from iris_rag.schemas import tool_specs
from tests.e2e.mcp_harness import result_json
from tests.e2e.paced import SLOW_DOCUMENTS, paced_endpoint, paced_settings
from tests.e2e.test_mcp_server import DOCUMENTS

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CALL_TIMEOUT_S = 120
START_TIMEOUT_S = 120
READY = re.compile(r"MCP server ready on (http://\S+)/mcp")
MAX_BODY = 256 * 1024

# Keys as a client holds them; the file holds only their hashes.
KEYS = {
    "admin": "k-admin-0",
    "alice": "k-alice-0",
    "bob": "k-bob-0",
    "carol": "k-carol-0",
    "limited": "k-lim-0",
}
PRINCIPALS: list[dict[str, Any]] = [
    {"id": "admin", "scopes": ["admin"], "collections": ["*"]},
    {"id": "alice", "scopes": ["read", "write"], "collections": ["papers"]},
    {"id": "bob", "scopes": ["read"], "collections": ["notes"]},
    {"id": "carol", "scopes": ["read", "write"], "collections": ["*"]},
    {"id": "limited", "scopes": ["read"], "collections": ["papers"], "requests_per_minute": 3},
]


def write_auth_file(path: Path, keys: dict[str, str]) -> None:
    principals = [{**p, "key_sha256": hashlib.sha256(keys[p["id"]].encode()).hexdigest()} for p in PRINCIPALS]
    path.write_text(json.dumps({"principals": principals}))


@dataclass
class HttpServer:
    """A running `node mcp-server/dist/index.js` in HTTP mode."""

    process: subprocess.Popen[str]
    url: str
    auth_file: Path
    stderr: list[str] = field(default_factory=list)

    @property
    def mcp(self) -> str:
        return f"{self.url}/mcp"


def start_server(repo_root: Path, server_entry: Path, env: dict[str, str]) -> HttpServer:
    """Start the server on a free port and wait for its ready line (stderr is drained on a thread)."""
    process = subprocess.Popen(
        ["node", str(server_entry)],
        cwd=repo_root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = READY.search(line)
            if match and not ready.is_set():
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(START_TIMEOUT_S)
    if not found:
        process.kill()
        pytest.fail("the HTTP server did not start:\n" + "".join(lines[-30:]))
    return HttpServer(process, found[0], Path(env.get("RAG_AUTH_FILE", "")), lines)


@contextmanager
def keyed_server(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], folder: Path, settings: dict[str, str]
) -> Iterator[HttpServer]:
    """The server over HTTP with KEYS in its RAG_AUTH_FILE (written in folder) and these settings; stopped
    on leaving (killed after 20 s)."""
    auth_file = folder / "principals.json"
    write_auth_file(auth_file, KEYS)
    env = {**server_env, "MCP_TRANSPORT": "http", "MCP_SERVER_PORT": "0", "RAG_AUTH_FILE": str(auth_file)}
    server = start_server(repo_root, server_entry, {**env, **settings})
    try:
        yield server
    finally:
        server.process.terminate()
        try:
            server.process.wait(20)
        except subprocess.TimeoutExpired:
            server.process.kill()


@contextmanager
def paced_server(
    repo_root: Path,
    server_entry: Path,
    server_env: dict[str, str],
    folder: Path,
    settings: dict[str, str] | None = None,
) -> Iterator[HttpServer]:
    """keyed_server on a store of its own (in folder), embedding through a paced test double, so that
    SLOW_DOCUMENTS' ingest is still running seconds after its first progress step."""
    endpoint = paced_endpoint()
    env = {**server_env, "RAG_DATA_DIR": str(folder / "data")}
    paced = {**paced_settings(endpoint), **(settings or {})}
    try:
        with keyed_server(repo_root, server_entry, env, folder, paced) as server:
            yield server
    finally:
        endpoint.close()


@pytest.fixture(scope="module")
def http_server(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpServer]:
    settings = {"MCP_MAX_BODY_BYTES": str(MAX_BODY), "MCP_SERVER_NAME": "iris-rag-e2e"}
    with keyed_server(
        repo_root, server_entry, server_env, tmp_path_factory.mktemp("auth"), settings
    ) as server:
        yield server


@asynccontextmanager
async def connect(server: HttpServer, key: str) -> AsyncIterator[ClientSession]:
    """An MCP session over Streamable HTTP with the given key."""
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=CALL_TIMEOUT_S)
    async with (
        http,
        streamable_http_client(server.mcp, http_client=http) as (read, write, _),
        ClientSession(read, write) as client,
    ):
        with anyio.fail_after(START_TIMEOUT_S):
            await client.initialize()
        yield client


async def call(client: ClientSession, name: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(isError, the result's JSON)."""
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await client.call_tool(name, arguments)
    assert isinstance(result.content[0], TextContent)
    return bool(result.isError), result_json(result)


async def _seed(server: HttpServer) -> None:
    """papers and notes, each with the three documents, and a shared-free table in papers (admin key)."""
    async with connect(server, KEYS["admin"]) as admin:
        for collection in ("papers", "notes"):
            failed, body = await call(
                admin, "rag_ingest", {"collection_id": collection, "documents": DOCUMENTS}
            )
            assert not failed, body


@pytest.fixture(scope="module")
async def seeded(http_server: HttpServer) -> HttpServer:
    await _seed(http_server)
    return http_server


async def test_every_tool_over_streamable_http(seeded: HttpServer) -> None:
    async with connect(seeded, KEYS["admin"]) as client:
        init_tools = {tool.name for tool in (await client.list_tools()).tools}
        assert init_tools == {spec["name"] for spec in tool_specs()}
        query = {
            "query": "Which river flows through Paris?",
            "collection_id": "papers",
            "options": {"top_k": 2},
        }
        for tool in sorted(t for t in init_tools if t.removeprefix("rag_") in _techniques()):
            failed, answer = await call(client, tool, query)
            assert not failed, (tool, answer)
            assert answer["retrieved_documents"][0]["id"] == "seine", tool
        calls: list[tuple[str, dict[str, Any]]] = [
            ("rag_get_document", {"collection_id": "papers", "document_id": "seine"}),
            ("rag_list_collections", {}),
            ("rag_health_check", {}),
            ("rag_metrics", {}),
            ("rag_graph_explore", {"collection_id": "papers", "entity": "Paris"}),
            (
                "rag_ingest_table",
                {"table": "cities", "collection_id": "papers", "rows": [{"city": "Paris", "n": 2}]},
            ),
            ("rag_table_schema", {"collection_id": "papers"}),
            ("rag_list_documents", {"collection_id": "papers", "limit": 2}),
            ("rag_smart_questions", {"collection_id": "papers", "context": "rivers of France", "count": 2}),
            (
                "rag_generate_podcast",
                {"collection_id": "papers", "topic": "the Seine", "duration_minutes": 1},
            ),
            ("rag_delete_documents", {"collection_id": "papers", "document_ids": ["not-there"]}),
            ("rag_ingest", {"collection_id": "scratch", "documents": DOCUMENTS[:1]}),
            ("rag_update_collection", {"collection_id": "scratch", "description": "Scratch space."}),
            ("rag_delete_collection", {"collection_id": "scratch", "confirm_collection_id": "scratch"}),
        ]
        assert {name for name, _ in calls} | {f"rag_{t}" for t in _techniques()} == init_tools
        for name, arguments in calls:
            failed, body = await call(client, name, arguments)
            assert not failed, (name, body)


def _techniques() -> set[str]:
    return {spec["bridge"]["technique"] for spec in tool_specs() if "technique" in spec["bridge"]}


def _not_found_shape(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The error with the asked-for name blanked: what must be identical for hidden and missing."""
    error = dict(body["error"])
    error["message"] = error["message"].replace(repr(name), "'<name>'")
    details = dict(error.get("details", {}))
    details.pop("collection_id", None)
    error["details"] = details
    return error


async def test_authorization_matrix(seeded: HttpServer) -> None:
    """Every principal x tool x collection: allowed calls succeed; the rest are refused, revealing nothing."""
    grants: dict[str, set[str] | None] = {"admin": None, "alice": {"papers"}, "bob": {"notes"}, "carol": None}
    writers = {"admin", "alice", "carol"}
    query: dict[str, Any] = {
        "query": "Which river flows through Paris?",
        "options": {"top_k": 1, "generate": False},
    }
    for who, granted in grants.items():

        def sees(collection: str, granted: set[str] | None = granted) -> bool:
            return granted is None or collection in granted

        async with connect(seeded, KEYS[who]) as client:
            _, listing = await call(client, "rag_list_collections", {})
            listed = {c["id"] for c in listing["collections"]}
            assert listed >= {"papers", "notes"} if granted is None else listed == granted, (who, listed)
            for collection in ("papers", "notes", "missing"):
                exists = collection != "missing"
                allowed = exists and sees(collection)
                calls: list[tuple[str, dict[str, Any]]] = [
                    ("rag_basic", {**query, "collection_id": collection}),
                    ("rag_hybrid_ifind", {**query, "collection_id": collection}),
                    (
                        "rag_sqlrag",
                        {
                            **query,
                            "collection_id": collection,
                            "technique_params": {"sql": "SELECT 1 AS one"},
                        },
                    ),
                    ("rag_get_document", {"collection_id": collection, "document_id": "seine"}),
                    ("rag_table_schema", {"collection_id": collection}),
                ]
                for tool, arguments in calls:
                    failed, body = await call(client, tool, arguments)
                    assert failed == (not allowed), (who, tool, collection, body)
                    if failed:
                        text = json.dumps(body)
                        for other in ("papers", "notes"):
                            if other != collection and not sees(other):
                                assert other not in text, (who, tool, body)
                if exists and not allowed:  # hidden and missing collections give the very same answer
                    _, hidden = await call(client, "rag_basic", {**query, "collection_id": collection})
                    _, missing = await call(client, "rag_basic", {**query, "collection_id": "missing"})
                    assert _not_found_shape(hidden, collection) == _not_found_shape(missing, "missing")
            for collection in ("papers", "notes", f"new-{who}"):
                document = {"id": f"by-{who}", "content": f"Written by {who} about rivers."}
                failed, body = await call(
                    client, "rag_ingest", {"collection_id": collection, "documents": [document]}
                )
                assert failed == (who not in writers or not sees(collection)), (who, collection, body)
                if failed:
                    assert body["error"]["code"] == "FORBIDDEN", body
            # Shared tables (no collection) need a key granted every collection.
            failed, body = await call(
                client, "rag_ingest_table", {"table": f"shared_{who}", "rows": [{"a": 1}]}
            )
            assert failed == (granted is not None), (who, body)
    async with connect(seeded, KEYS["alice"]) as alice:  # what others created stays out of sight
        _, listing = await call(alice, "rag_list_collections", {})
        assert {c["id"] for c in listing["collections"]} == {"papers"}


async def test_a_key_cannot_replace_another_collections_table(seeded: HttpServer) -> None:
    """Security report, defect 2: alice (papers) replaced notes' table t_pay by ingesting a table 'pay'."""
    sql = {"sql": "SELECT who FROM t_pay", "combine_with_vector": False}
    read = {
        "query": "who?",
        "collection_id": "notes",
        "options": {"generate": False},
        "technique_params": sql,
    }
    async with connect(seeded, KEYS["admin"]) as admin, connect(seeded, KEYS["alice"]) as alice:
        failed, body = await call(
            admin, "rag_ingest_table", {"table": "pay", "collection_id": "notes", "rows": [{"who": "notes"}]}
        )
        assert not failed, body
        failed, body = await call(
            alice, "rag_ingest_table", {"table": "pay", "collection_id": "papers", "rows": [{"who": "alice"}]}
        )
        assert failed and body["error"]["code"] == "FORBIDDEN", body
        assert "notes" not in json.dumps(body), "nothing about the hidden collection"
        failed, body = await call(admin, "rag_sqlrag", read)
        assert not failed and body["metadata"]["technique_specific"]["rows"] == [["notes"]], body


async def test_resources_show_only_the_keys_collections(seeded: HttpServer) -> None:
    async with connect(seeded, KEYS["bob"]) as bob:
        listed = {str(r.uri) for r in (await bob.list_resources()).resources}
        assert "rag://collection/notes/stats" in listed and "rag://collection/papers/stats" not in listed
        notes = await bob.read_resource(AnyUrl("rag://collection/notes/documents"))
        assert notes.contents
        with pytest.raises(McpError) as hidden:
            await bob.read_resource(AnyUrl("rag://collection/papers/stats"))
        assert hidden.value.error.code == -32002  # the same answer as for a collection that does not exist


async def test_metrics_are_per_key_and_admin_sees_everyone(seeded: HttpServer) -> None:
    async with connect(seeded, KEYS["bob"]) as bob:
        await call(bob, "rag_basic", {"query": "river", "collection_id": "notes"})
        _, mine = await call(bob, "rag_metrics", {"time_range": "1h"})
        assert "by_principal" not in mine
        assert mine["overall"]["request_count"] >= 1
    async with connect(seeded, KEYS["admin"]) as admin:
        _, everyone = await call(admin, "rag_metrics", {"time_range": "1h"})
        assert {"admin", "bob"} <= set(everyone["by_principal"])
        assert everyone["overall"]["request_count"] > mine["overall"]["request_count"]


async def test_scopes_refuse_tools_with_forbidden(seeded: HttpServer) -> None:
    async with connect(seeded, KEYS["bob"]) as bob:
        failed, body = await call(bob, "rag_ingest", {"collection_id": "notes", "documents": DOCUMENTS[:1]})
        assert failed and body["error"]["code"] == "FORBIDDEN"
        assert "write" in body["error"]["message"]


async def test_rate_limit_per_key(seeded: HttpServer) -> None:
    async with connect(seeded, KEYS["limited"]) as client:
        outcomes = [await call(client, "rag_list_collections", {}) for _ in range(5)]
    refused = [body for failed, body in outcomes if failed]
    assert len(refused) >= 2, outcomes
    assert refused[0]["error"]["code"] == "RATE_LIMIT_EXCEEDED"
    assert refused[0]["error"]["details"]["retry_after_ms"] > 0


async def test_missing_or_wrong_key_is_401_with_www_authenticate(seeded: HttpServer) -> None:
    initialize = _initialize_body()
    async with httpx.AsyncClient(timeout=30) as client:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"X-API-Key": "nope"}):
            response = await client.post(seeded.mcp, json=initialize, headers={**_ACCEPT, **headers})
            assert response.status_code == 401, headers
            assert response.headers["www-authenticate"].startswith("Bearer")
        # X-API-Key works as well as a bearer token.
        response = await client.post(
            seeded.mcp, json=initialize, headers={**_ACCEPT, "X-API-Key": KEYS["bob"]}
        )
        assert response.status_code == 200


async def test_foreign_origin_and_oversized_body_are_refused(seeded: HttpServer) -> None:
    headers = {**_ACCEPT, "Authorization": f"Bearer {KEYS['admin']}"}
    async with httpx.AsyncClient(timeout=30) as client:
        evil = await client.post(
            seeded.mcp, json=_initialize_body(), headers={**headers, "Origin": "http://evil.example"}
        )
        assert evil.status_code == 403
        local = await client.post(
            seeded.mcp, json=_initialize_body(), headers={**headers, "Origin": "http://localhost:6274"}
        )
        assert local.status_code == 200
        big = {**_initialize_body(), "padding": "x" * (MAX_BODY + 1)}
        response = await client.post(seeded.mcp, content=json.dumps(big), headers=headers)
        assert response.status_code == 413


async def test_another_keys_session_is_not_found(seeded: HttpServer) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        opened = await client.post(
            seeded.mcp,
            json=_initialize_body(),
            headers={**_ACCEPT, "Authorization": f"Bearer {KEYS['alice']}"},
        )
        session_id = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        stolen = await client.post(
            seeded.mcp,
            json=listing,
            headers={**_ACCEPT, "Authorization": f"Bearer {KEYS['bob']}", "mcp-session-id": session_id},
        )
        assert stolen.status_code == 404


async def test_health_needs_no_key_and_shows_no_secrets(seeded: HttpServer) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.get(f"{seeded.url}/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] in {"healthy", "degraded"}
    assert set(body["components"]) >= {"python_bridge"}
    assert all(set(c) == {"status"} for c in body["components"].values())


async def test_health_probes_are_not_recorded_as_calls(seeded: HttpServer) -> None:
    """Each GET /health was recorded as a rag_health_check call by 'local': 3,600 an hour at one a second."""

    async def health_calls() -> int:
        async with connect(seeded, KEYS["admin"]) as admin:
            _, metrics = await call(admin, "rag_metrics", {"time_range": "1h"})
        return int(metrics["by_tool"].get("rag_health_check", {}).get("request_count", 0))

    before = await health_calls()
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(2):
            assert (await client.get(f"{seeded.url}/health")).status_code == 200
            await anyio.sleep(1.1)  # past HEALTH_REUSE_MS: each asks the worker
    assert await health_calls() == before


async def test_keys_rotate_by_editing_the_file(seeded: HttpServer) -> None:
    rotated = {**KEYS, "alice": "k-alice-1"}
    time.sleep(0.05)  # a distinct modification time even on coarse clocks
    write_auth_file(seeded.auth_file, rotated)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            old = await client.post(
                seeded.mcp,
                json=_initialize_body(),
                headers={**_ACCEPT, "Authorization": f"Bearer {KEYS['alice']}"},
            )
            assert old.status_code == 401
        async with connect(seeded, rotated["alice"]) as alice:
            failed, _ = await call(alice, "rag_list_collections", {})
            assert not failed
    finally:
        write_auth_file(seeded.auth_file, KEYS)


def test_refuses_a_public_address_without_keys(
    repo_root: Path, server_entry: Path, server_env: dict[str, str]
) -> None:
    env = {**server_env, "MCP_TRANSPORT": "http", "MCP_SERVER_HOST": "0.0.0.0", "MCP_SERVER_PORT": "0"}
    env.pop("RAG_AUTH_FILE", None)
    done = subprocess.run(
        ["node", str(server_entry)],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "RAG_AUTH_FILE" in done.stderr


_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _initialize_body() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }


async def test_initialize_reports_the_configured_name(seeded: HttpServer) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(
            seeded.mcp, json=_initialize_body(), headers={**_ACCEPT, "X-API-Key": KEYS["bob"]}
        )
    data = next(line[6:] for line in response.text.splitlines() if line.startswith("data: "))
    assert json.loads(data)["result"]["serverInfo"]["name"] == "iris-rag-e2e"


async def test_a_cancelled_call_ends_its_response_stream(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], tmp_path: Path
) -> None:
    """After notifications/cancelled the server sends no response (as the specification says) but ends the
    call's SSE stream: a client waiting on it is not left open for the session's life."""
    with paced_server(repo_root, server_entry, server_env, tmp_path) as server:
        headers = {**_ACCEPT, "Authorization": f"Bearer {KEYS['admin']}"}
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
            opened = await http.post(server.mcp, json=_initialize_body(), headers=headers)
            assert opened.status_code == 200, opened.text
            headers = {
                **headers,
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-06-18",
            }
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            assert (await http.post(server.mcp, json=initialized, headers=headers)).status_code == 202
            ingest = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {
                    "name": "rag_ingest",
                    "arguments": {"collection_id": "cancelled", "documents": SLOW_DOCUMENTS},
                    "_meta": {"progressToken": "ingest-7"},
                },
            }
            messages: list[dict[str, Any]] = []
            async with http.stream("POST", server.mcp, json=ingest, headers=headers) as stream:
                assert stream.status_code == 200
                lines = stream.aiter_lines()
                with anyio.fail_after(CALL_TIMEOUT_S):  # until the ingest is running: its first step
                    async for line in lines:
                        if line.startswith("data: "):
                            messages.append(json.loads(line[6:]))
                            break
                assert messages and messages[0]["method"] == "notifications/progress", messages
                cancel = {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": {"requestId": 7, "reason": "the test cancels it"},
                }
                assert (await http.post(server.mcp, json=cancel, headers=headers)).status_code == 202
                # Before the fix the stream stayed open (": keepalive" every 15 s) until the session ended.
                with anyio.fail_after(10):
                    async for line in lines:
                        if line.startswith("data: "):
                            messages.append(json.loads(line[6:]))
            assert all("id" not in message for message in messages), messages
            # The session goes on serving.
            listing = {
                "jsonrpc": "2.0",
                "id": 8,
                "method": "tools/call",
                "params": {"name": "rag_list_collections", "arguments": {}},
            }
            listed = await http.post(server.mcp, json=listing, headers=headers)
            assert listed.status_code == 200
            assert '"id":8' in listed.text.replace(" ", ""), listed.text

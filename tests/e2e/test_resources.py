"""Collections and documents as MCP resources, through the real server and the official client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import ClientSession, McpError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.session import RequestResponder
from mcp.types import (
    ClientResult,
    ResourceListChangedNotification,
    ServerNotification,
    ServerRequest,
    TextResourceContents,
)
from pydantic import AnyUrl

from tests.e2e.conftest import INITIALIZE_TIMEOUT_S

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

DOCUMENTS = [
    {"id": f"note/{i}#x", "title": f"Note {i}", "content": f"Tide note {i}: the moon pulls the sea."}
    for i in range(5)
]


class Session:
    """A client session that counts resources/list_changed notifications."""

    def __init__(self) -> None:
        self.list_changed = 0
        self.client: ClientSession

    async def on_message(
        self, message: RequestResponder[ServerRequest, ClientResult] | ServerNotification | Exception
    ) -> None:
        if isinstance(message, ServerNotification) and isinstance(
            message.root, ResourceListChangedNotification
        ):
            self.list_changed += 1


@pytest.fixture(scope="module")
async def watched(repo_root: Path, server_entry: Path, server_env: dict[str, str]) -> AsyncIterator[Session]:
    params = StdioServerParameters(command="node", args=[str(server_entry)], env=server_env, cwd=repo_root)
    session = Session()
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, message_handler=session.on_message) as client,
    ):
        with anyio.fail_after(INITIALIZE_TIMEOUT_S):
            initialized = await client.initialize()
        assert initialized.capabilities.resources is not None
        assert initialized.capabilities.resources.listChanged is True
        session.client = client
        with anyio.fail_after(120):
            ingested = await client.call_tool(
                "rag_ingest", {"collection_id": "tides", "documents": DOCUMENTS}
            )
        assert not ingested.isError
        yield session


async def read_json(client: ClientSession, uri: str) -> Any:
    result = await client.read_resource(AnyUrl(uri))
    content = result.contents[0]
    assert isinstance(content, TextResourceContents) and content.mimeType == "application/json"
    return orjson.loads(content.text)


async def test_resources_list_collections_and_templates(watched: Session) -> None:
    listed = {str(r.uri) for r in (await watched.client.list_resources()).resources}
    assert {"rag://collections", "rag://collection/tides/stats", "rag://collection/tides/documents"} <= listed
    templates = {t.uriTemplate for t in (await watched.client.list_resource_templates()).resourceTemplates}
    assert templates == {
        "rag://collection/{collection_id}/stats",
        "rag://collection/{collection_id}/documents{?cursor,limit}",
        "rag://collection/{collection_id}/document/{document_id}",
        "rag://podcast/{name}",
    }


async def test_collections_and_stats_read_as_json(watched: Session) -> None:
    collections = await read_json(watched.client, "rag://collections")
    assert "tides" in {c["id"] for c in collections["collections"]}
    await watched.client.call_tool(
        "rag_update_collection", {"collection_id": "tides", "description": "Tide notes."}
    )
    stats = await read_json(watched.client, "rag://collection/tides/stats")
    assert stats["document_count"] == 5 and stats["description"] == "Tide notes."


async def test_documents_are_paged_and_each_reads_as_its_text(watched: Session) -> None:
    first = await read_json(watched.client, "rag://collection/tides/documents?limit=2")
    assert [d["id"] for d in first["documents"]] == ["note/0#x", "note/1#x"]
    seen = [d["id"] for d in first["documents"]]
    page = first
    while page["next_uri"]:
        page = await read_json(watched.client, page["next_uri"])
        seen += [d["id"] for d in page["documents"]]
    assert seen == [d["id"] for d in DOCUMENTS]
    text = await watched.client.read_resource(AnyUrl("rag://collection/tides/document/note%2F3%23x"))
    content = text.contents[0]
    assert isinstance(content, TextResourceContents) and content.mimeType == "text/plain"
    assert content.text == DOCUMENTS[3]["content"]


@pytest.mark.parametrize(
    ("uri", "code"),
    [
        ("rag://collection/nope/stats", -32002),
        ("rag://collection/tides/document/missing", -32002),
        ("rag://collection/nope/documents", -32002),
        ("rag://elsewhere", -32602),
        ("rag://collection/tides/documents?limit=0", -32602),
    ],
)
async def test_a_missing_or_malformed_resource_is_a_clear_error(
    watched: Session, uri: str, code: int
) -> None:
    with anyio.fail_after(60), pytest.raises(McpError) as raised:
        await watched.client.read_resource(AnyUrl(uri))
    assert raised.value.error.code == code, raised.value.error.message
    assert raised.value.error.message


async def test_each_write_announces_that_the_resources_changed(watched: Session) -> None:
    before = watched.list_changed
    await watched.client.call_tool("rag_ingest", {"collection_id": "tides2", "documents": DOCUMENTS[:1]})
    await watched.client.call_tool(
        "rag_delete_collection", {"collection_id": "tides2", "confirm_collection_id": "tides2"}
    )
    await watched.client.call_tool(
        "rag_basic", {"query": "moon", "collection_id": "tides"}
    )  # a read: no notice
    with anyio.fail_after(30):
        while watched.list_changed < before + 2:
            await anyio.sleep(0.05)
    await anyio.sleep(0.5)
    assert watched.list_changed == before + 2

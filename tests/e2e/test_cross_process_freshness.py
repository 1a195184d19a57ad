"""The running MCP server sees what another process writes: `iris-rag ingest` and a delete, no restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from iris_rag.embedder import Embedder
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS
from tests.e2e.mcp_harness import result_json

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CALL_TIMEOUT_S = 120  # the first ingest also loads the embedding model
PENGUIN = {
    "_id": "penguin",
    "title": "Emperor penguins of Antarctica",
    "text": "Emperor penguins breed on Antarctic sea ice through the polar winter. "
    "The male emperor penguin incubates the egg on its feet for two months.",
}
QUERY = "How do emperor penguins incubate their eggs in Antarctica?"
TOOLS = ("rag_basic", "rag_hybrid_ifind", "rag_noderag", "rag_graphrag", "rag_colbert")


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await session.call_tool(name, arguments)
    assert not result.isError, result.content
    return result_json(result)


async def top_ids(session: ClientSession, tool: str) -> list[str]:
    arguments = {"query": QUERY, "collection_id": "fresh", "options": {"generate": False, "top_k": 3}}
    return [d["id"] for d in (await call(session, tool, arguments))["retrieved_documents"]]


async def test_cli_ingest_and_a_delete_are_seen_by_the_next_call(
    session: ClientSession, server_env: dict[str, str], repo_root: Path, tmp_path: Path, embedder: Embedder
) -> None:
    await call(session, "rag_ingest", {"collection_id": "fresh", "documents": DOCUMENTS})
    for tool in TOOLS:  # every cache warm, before the other process writes
        assert "penguin" not in await top_ids(session, tool), tool

    corpus = tmp_path / "penguin.jsonl"
    corpus.write_text(json.dumps(PENGUIN) + "\n")
    command = [sys.executable, "-m", "iris_rag.cli", "ingest", str(corpus), "--collection", "fresh"]
    await anyio.to_thread.run_sync(
        lambda: subprocess.run(command, cwd=repo_root, env=server_env, check=True, capture_output=True)
    )
    for tool in TOOLS:
        assert (await top_ids(session, tool))[0] == "penguin", tool

    # Another process (this one, with its own store and technique indexes) deletes it.
    other = RagService(Settings(RAG_DATA_DIR=Path(server_env["RAG_DATA_DIR"])), embedder=embedder)
    try:
        assert other.store.delete_document("fresh", "penguin")
    finally:
        other.close()
    for tool in TOOLS:
        assert "penguin" not in await top_ids(session, tool), tool

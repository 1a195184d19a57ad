"""rag_ingest's paths through the real server: files under RAG_INGEST_ROOTS go in, others do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import ClientSession

from tests.e2e.test_mcp_server import call
from tests.ingestion.make_files import write_pdf

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ingest-root")
    write_pdf(folder / "ice.pdf", ["Glaciers carve U-shaped valleys as they flow."], title="Ice")
    (folder / "bees.html").write_text(
        "<html><head><title>Bees</title></head><body><p>Bees dance to show where flowers are.</p></body>",
        encoding="utf-8",
    )
    (folder.parent / "outside.txt").write_text("Not for clients.", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def server_env(server_env: dict[str, str], root: Path) -> dict[str, str]:
    """The shared environment, with the root folder as the only one clients may read."""
    return {**server_env, "RAG_INGEST_ROOTS": str(root), "RAG_TECHNIQUES": "basic"}


async def test_a_folder_under_the_root_is_ingested_and_answers(session: ClientSession, root: Path) -> None:
    ingested, body = await call(session, "rag_ingest", {"collection_id": "files", "paths": [str(root)]})
    assert not ingested.isError, body
    assert sorted(body["document_ids"]) == ["bees.html", "ice.pdf"]
    assert body["errors"] == []
    query = {"query": "What shapes valleys?", "collection_id": "files", "options": {"generate": False}}
    result, answer = await call(session, "rag_basic", query)
    assert not result.isError, answer
    assert answer["retrieved_documents"][0]["id"] == "ice.pdf"


async def test_a_path_outside_the_root_is_an_error_result(session: ClientSession, root: Path) -> None:
    outside = str(root / ".." / "outside.txt")
    result, body = await call(session, "rag_ingest", {"collection_id": "files", "paths": [outside]})
    assert result.isError
    assert body["error"]["code"] == "INVALID_PARAMETERS"
    assert "RAG_INGEST_ROOTS" in body["error"]["message"]

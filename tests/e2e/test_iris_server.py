"""The real MCP server on InterSystems IRIS (RAG_STORE=iris), through the official Python client.

Runs only where an IRIS server is reachable (IRIS_HOST set, e.g. `docker compose -f docker-compose.iris.yml
up -d iris`); skipped with that reason elsewhere. The techniques whose rows have no IRIS storage yet
(graphrag, sqlrag) are not served on IRIS.
"""

from __future__ import annotations

import pytest
from mcp import ClientSession

from tests.conftest import iris_env
from tests.e2e.test_mcp_server import DOCUMENTS, call

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
SERVED = ["rag_basic", "rag_colbert", "rag_crag", "rag_hybrid_ifind", "rag_hyde", "rag_noderag"]


@pytest.fixture(scope="module")
def store_env() -> dict[str, str]:
    """RAG_STORE=iris on this environment's server (skipped without IRIS_HOST), the IRIS techniques only."""
    return {**iris_env(), "RAG_TECHNIQUES": ",".join(t.removeprefix("rag_") for t in SERVED)}


async def test_serves_and_answers_from_iris(session: ClientSession) -> None:
    tools = {tool.name for tool in (await session.list_tools()).tools}
    assert set(SERVED) <= tools

    await call(
        session, "rag_delete_collection", {"collection_id": "iris_e2e", "confirm_collection_id": "iris_e2e"}
    )
    ingested, body = await call(session, "rag_ingest", {"collection_id": "iris_e2e", "documents": DOCUMENTS})
    assert not ingested.isError, body
    assert body["ingested_count"] == 3

    arguments = {
        "query": "Which river flows through Paris?",
        "collection_id": "iris_e2e",
        "options": {"top_k": 2},
    }
    for tool in SERVED:
        result, answer = await call(session, tool, arguments)
        assert not result.isError, answer
        assert answer["retrieved_documents"][0]["id"] == "seine", tool

    health_result, health = await call(session, "rag_health_check", {"include_details": True})
    assert not health_result.isError, health
    assert "iris_database" in health["components"], health
    assert health["components"]["iris_database"]["status"] == "healthy", health
    assert "IRIS_PASSWORD" not in str(health)

    document_result, document = await call(
        session, "rag_get_document", {"collection_id": "iris_e2e", "document_id": "seine"}
    )
    assert not document_result.isError, document
    assert document["content"].startswith("Paris is the capital"), document

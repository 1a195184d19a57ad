"""RAG_STORE=postgres through the whole service: settings, start-up checks, ingest and answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from iris_rag.embedder import Embedder
from iris_rag.redaction import redact
from iris_rag.service import RagService
from iris_rag.settings import Settings
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


def test_techniques_without_postgres_storage_fail_at_start(
    postgres_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    settings = Settings(RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url, RAG_DATA_DIR=tmp_path)
    with pytest.raises(ValueError, match=r"not yet available on the postgres store.*RAG_TECHNIQUES=basic"):
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

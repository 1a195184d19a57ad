"""EMBEDDING_PROVIDER=openai: an OpenAI-compatible /embeddings endpoint in place of the local model.

The endpoint is FakeOpenAIServer (tests/fake_openai.py), a test double for a hosted API, spoken to over real
HTTP by the real `openai` client; everything else (store, ingest, techniques, worker dispatch) is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from iris_rag.embedder import Embedder
from iris_rag.embedding_api import ApiEmbedder
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.worker.dispatch import Dispatcher
from tests.conftest import DOCUMENTS
from tests.fake_openai import EMBEDDING_DIMENSIONS, FakeOpenAIServer

KEY = "sk-embedding-secret"
SERVED = "basic,hyde,hybrid_ifind,crag,noderag"


@pytest.fixture
def endpoint() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    yield server
    server.close()


def _settings(tmp_path: Path, base_url: str, **extra: object) -> Settings:
    values: dict[str, object] = {
        "RAG_DATA_DIR": tmp_path,
        "EMBEDDING_PROVIDER": "openai",
        "EMBEDDING_MODEL": "fake-embedder",
        "EMBEDDING_BASE_URL": base_url,
        "EMBEDDING_API_KEY": KEY,
        "EMBEDDING_MAX_RETRIES": 0,
        "EMBEDDING_TIMEOUT_S": 5,
        "RAG_TECHNIQUES": SERVED,
        **extra,
    }
    return Settings(**values)  # type: ignore[arg-type]


def _basic(query: str) -> dict[str, object]:
    return {"technique": "basic", "arguments": {"query": query, "collection_id": "docs"}}


def test_ingest_and_query_through_the_embedding_api(tmp_path: Path, endpoint: FakeOpenAIServer) -> None:
    service = RagService(_settings(tmp_path, endpoint.base_url))
    try:
        assert isinstance(service.embedder, ApiEmbedder)
        assert service.ingest({"collection_id": "docs", "documents": DOCUMENTS})["ingested_count"] == 3
        answer = service.execute(_basic("volcanic eruptions of runny lava"))
        assert answer["retrieved_documents"][0]["id"] == "volcano"
        assert answer["metadata"]["model_info"]["embedding_model"] == "openai:fake-embedder"
        collection = service.list_collections({})["collections"][0]
        assert (collection["embedding_model"], collection["dimension"]) == (
            "openai:fake-embedder",
            EMBEDDING_DIMENSIONS,
        )
        # Every technique served on the API answers, rag_hyde with its approximate token counts.
        for technique in SERVED.split(","):
            arguments = {"query": "sourdough fermentation", "collection_id": "docs"}
            result = service.execute({"technique": technique, "arguments": arguments})
            assert result["retrieved_documents"], technique
        embedding_calls = [r for r in endpoint.requests if r["path"].endswith("/embeddings")]
        assert embedding_calls and all(r["auth"] == f"Bearer {KEY}" for r in embedding_calls)
        assert {r["body"]["model"] for r in embedding_calls} == {"fake-embedder"}
        health = service.health_check({"include_details": True})["components"]["embedding_service"]
        assert health["status"] == "healthy"
        assert health["details"]["provider"] == "openai"
    finally:
        service.close()


def test_dimensions_are_asked_for_and_recorded(tmp_path: Path, endpoint: FakeOpenAIServer) -> None:
    service = RagService(_settings(tmp_path, endpoint.base_url, EMBEDDING_DIMENSIONS=16))
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        collection = service.list_collections({})["collections"][0]
        assert (collection["embedding_model"], collection["dimension"]) == ("openai:fake-embedder@16", 16)
        assert all(r["body"].get("dimensions") == 16 for r in endpoint.requests)
        vector = service.embedder.encode_query("lava")
        assert vector.shape == (16,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-5
    finally:
        service.close()


def test_collections_never_mix_the_api_and_the_local_model(
    tmp_path: Path, endpoint: FakeOpenAIServer, embedder: Embedder
) -> None:
    api = RagService(_settings(tmp_path, endpoint.base_url))
    api.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    api.close()
    local = RagService(Settings(RAG_DATA_DIR=tmp_path, RAG_TECHNIQUES=SERVED), embedder=embedder)
    try:
        ok, error = Dispatcher(local).call("execute", _basic("lava"))
        assert not ok and error["code"] == "EMBEDDING_MISMATCH", error
        ok, error = Dispatcher(local).call(
            "ingest", {"collection_id": "docs", "documents": [{"content": "more text"}]}
        )
        assert not ok and error["code"] == "EMBEDDING_MISMATCH", error
    finally:
        local.close()


def test_an_unreachable_endpoint_is_embedding_service_unavailable(
    tmp_path: Path, endpoint: FakeOpenAIServer
) -> None:
    url = endpoint.base_url.replace("http://", "http://user:url-secret-pw@")
    endpoint.close()  # nothing listens on its port any more
    service = RagService(_settings(tmp_path, url))
    try:
        dispatcher = Dispatcher(service)
        ok, error = dispatcher.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
        assert not ok and error["code"] == "EMBEDDING_SERVICE_UNAVAILABLE", error
        health = service.health_check({"include_details": True})
        assert health["components"]["embedding_service"]["status"] == "unhealthy"
        text = json.dumps([error, health])
        assert KEY not in text and "url-secret-pw" not in text
    finally:
        service.close()


def test_an_endpoint_that_fails_is_embedding_service_unavailable(
    tmp_path: Path, endpoint: FakeOpenAIServer
) -> None:
    endpoint.status = 500
    service = RagService(_settings(tmp_path, endpoint.base_url))
    try:
        ok, error = Dispatcher(service).call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
        assert not ok and error["code"] == "EMBEDDING_SERVICE_UNAVAILABLE", error
        endpoint.status = 200  # it recovers: the next call works without a restart
        ok, _ = Dispatcher(service).call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
        assert ok
    finally:
        service.close()


def test_a_base_url_with_a_query_and_userinfo_keeps_its_paths_and_the_key(
    tmp_path: Path, endpoint: FakeOpenAIServer
) -> None:
    """The path goes before the URL's query (the client appended /embeddings to the query), and the key
    goes as Bearer (httpx replaced it with the URL's user:password as Basic auth)."""
    url = endpoint.base_url.replace("http://", "http://user:url-secret-pw@") + "?api-version=2024-06"
    service = RagService(_settings(tmp_path, url))
    try:
        service.embedder.encode_query("lava")
        assert endpoint.requests
        for request in endpoint.requests:
            assert (request["path"], request["auth"]) == (
                "/v1/embeddings?api-version=2024-06",
                f"Bearer {KEY}",
            )
    finally:
        service.close()


def test_colbert_is_refused_at_start_by_name(
    tmp_path: Path,
    endpoint: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from iris_rag.cli import main

    with pytest.raises(ValueError, match="rag_colbert needs the local embedding model"):
        RagService(_settings(tmp_path, endpoint.base_url, RAG_TECHNIQUES="basic,colbert"))
    # The command line with the default techniques: one line, as any setting that is not valid.
    documents = tmp_path / "docs.txt"
    documents.write_text("some text", encoding="utf-8")
    for name, value in {
        "RAG_DATA_DIR": str(tmp_path / "data"),
        "EMBEDDING_PROVIDER": "openai",
        "EMBEDDING_MODEL": "fake-embedder",
        "EMBEDDING_BASE_URL": endpoint.base_url,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAG_TECHNIQUES", raising=False)
    assert main(["ingest", str(documents), "--collection", "c"]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith("error: rag_colbert needs the local embedding model")
        and len(error.splitlines()) == 1
    )


def test_the_api_needs_a_model_name(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="EMBEDDING_MODEL"):
        Settings(RAG_DATA_DIR=tmp_path, EMBEDDING_PROVIDER="openai")

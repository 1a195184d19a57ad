"""rag_basic end to end in Python: real model, real store."""

import pytest

from iris_rag.errors import CollectionNotFoundError, EmbeddingMismatchError
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS, ask


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Does aspirin prevent heart attacks?", "aspirin"),
        ("how does lava flow from a volcano", "volcano"),
        ("why does sourdough bread rise", "sourdough"),
    ],
)
def test_the_right_document_ranks_first(loaded_service: RagService, query: str, expected: str) -> None:
    result = ask(loaded_service, query)
    documents = result["retrieved_documents"]
    assert isinstance(documents, list)
    assert documents[0]["id"] == expected
    scores = [d["similarity_score"] for d in documents]
    assert scores == sorted(scores, reverse=True)
    assert f"[1] {next(d['title'] for d in DOCUMENTS if d['id'] == expected)}" in str(result["answer"])


def test_response_shape_and_measured_times(loaded_service: RagService) -> None:
    result = ask(loaded_service, "aspirin bleeding risk")
    assert result["success"] is True
    assert result["technique"] == "basic"
    performance = result["performance"]
    assert isinstance(performance, dict)
    assert performance["documents_searched"] == 3
    assert performance["total_time_ms"] >= performance["retrieval_time_ms"] > 0
    metadata = result["metadata"]
    assert isinstance(metadata, dict)
    assert metadata["model_info"] == {
        "embedding_model": "sentence-transformers/all-MiniLM-L6-v2",
        "llm_model": "extractive",
    }
    document = result["retrieved_documents"][0]
    assert document["metadata"]["topic"] == "cardiology"
    assert document["source"] == "docs/aspirin"
    assert document["chunk_id"] == "aspirin#0"


def test_top_k_min_similarity_include_sources_and_generate(loaded_service: RagService) -> None:
    assert len(ask(loaded_service, "aspirin", options={"top_k": 1})["retrieved_documents"]) == 1
    assert len(ask(loaded_service, "aspirin", options={"top_k": 3})["retrieved_documents"]) == 3
    strict = ask(loaded_service, "aspirin heart attack", options={"top_k": 3, "min_similarity": 0.4})
    assert [d["id"] for d in strict["retrieved_documents"]] == ["aspirin"]
    nothing = ask(loaded_service, "aspirin", options={"min_similarity": 0.99})
    assert nothing["retrieved_documents"] == []
    assert "Nothing relevant was found" in str(nothing["answer"])
    hidden = ask(loaded_service, "aspirin", options={"include_sources": False})
    assert hidden["retrieved_documents"] == [] and "[1]" in str(hidden["answer"])
    shown = ask(loaded_service, "aspirin")
    # Left out, which a reader must tell from "nothing retrieved".
    assert hidden["metadata"]["sources_omitted"] == len(shown["retrieved_documents"]) > 0
    assert "sources_omitted" not in shown["metadata"]
    evidence = ask(loaded_service, "aspirin", options={"generate": False})
    assert evidence["answer"] is None
    assert evidence["metadata"]["answer_source"] == "none"
    assert evidence["retrieved_documents"]


def test_unknown_collection(loaded_service: RagService) -> None:
    with pytest.raises(CollectionNotFoundError, match="'nope' does not exist"):
        ask(loaded_service, "x", collection_id="nope")


def test_embedding_mismatch_names_both_models(loaded_service: RagService, settings: Settings) -> None:
    other = RagService(
        Settings(RAG_DATA_DIR=settings.data_dir, EMBEDDING_MODEL="/models/other-model"),
        embedder=loaded_service.embedder,
    )
    with pytest.raises(EmbeddingMismatchError) as query_error:
        ask(other, "aspirin")
    message = query_error.value.message
    assert "sentence-transformers/all-MiniLM-L6-v2" in message and "/models/other-model" in message
    with pytest.raises(EmbeddingMismatchError):
        other.ingest({"collection_id": "docs", "documents": [{"content": "new"}]})
    assert loaded_service.store.get_collection("docs").document_count == 3  # type: ignore[union-attr]

"""What a collection records of its embedding model, and the service refusing to mix two models' vectors."""

from __future__ import annotations

import pytest

from iris_rag.embedder import Embedder
from iris_rag.errors import EmbeddingMismatchError
from iris_rag.service import RagService
from iris_rag.settings import PACKAGED_MODEL_NAME
from iris_rag.stores.base import DocumentStore, NewCollection
from tests.backends.contract.conftest import Backend
from tests.backends.contract.corpus import document, unit_vector
from tests.conftest import DOCUMENTS


def test_a_collection_records_its_model_and_dimension(store: DocumentStore) -> None:
    created = store.create_collection("c", "model-a", 8)
    assert (created.id, created.embedding_model, created.dimension) == ("c", "model-a", 8)
    # Creating it again changes nothing: the first model stays.
    again = store.create_collection("c", "model-b", 16)
    assert (again.embedding_model, again.dimension) == ("model-a", 8)
    vectors = [unit_vector(1, 16)]
    store.upsert_documents(
        "d", [document("x", ["text"], vectors=vectors)], new_collection=NewCollection("m", 16)
    )
    infos = {c.id: (c.embedding_model, c.dimension) for c in store.list_collections()}
    assert infos == {"c": ("model-a", 8), "d": ("m", 16)}


def test_the_service_refuses_a_query_and_an_ingest_with_another_model(
    backend: Backend, embedder: Embedder
) -> None:
    owner = RagService(backend.settings(), embedder=embedder)
    other = RagService(backend.settings(EMBEDDING_MODEL="/models/other-model"), embedder=embedder)
    try:
        owner.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        info = owner.store.get_collection("docs")
        assert info is not None
        assert (info.embedding_model, info.dimension) == (PACKAGED_MODEL_NAME, embedder.dimension)
        arguments = {"query": "aspirin", "collection_id": "docs", "options": {"generate": False}}
        with pytest.raises(EmbeddingMismatchError) as refused:
            other.execute({"technique": "basic", "arguments": arguments})
        assert refused.value.details["collection_model"] == PACKAGED_MODEL_NAME
        assert refused.value.details["configured_model"] == "/models/other-model"
        with pytest.raises(EmbeddingMismatchError):
            other.ingest({"collection_id": "docs", "documents": [{"content": "new"}]})
        after = owner.store.get_collection("docs")
        assert after is not None and after.document_count == 3
        # The model it was built with still answers.
        assert owner.execute({"technique": "basic", "arguments": arguments})["retrieved_documents"]
    finally:
        other.close()
        owner.close()

"""The embedding cache holds vectors of the documents the store holds, not of every document it ever held.

Every cached vector is tagged with the collection and document it was made for (the ingest's chunk texts,
NodeRAG's sentences, GraphRAG's entity names): deleting the document or the collection deletes them, and
replacing the document with other text deletes its old texts' vectors.
"""

from __future__ import annotations

import json
from typing import Any

from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.service import RagService
from tests.conftest import SAMPLE_CORPUS


def _corpus(count: int) -> list[dict[str, Any]]:
    with SAMPLE_CORPUS.open(encoding="utf-8") as lines:
        rows = [json.loads(line) for _, line in zip(range(count), lines, strict=False)]
    return [{"id": row["_id"], "title": row["title"], "content": row["text"]} for row in rows]


def _cache_rows(rag: RagService) -> int:
    store = rag.store
    assert isinstance(store, SqliteStore | PostgresStore)
    row = store.connection().execute("SELECT COUNT(*) AS n FROM embedding_cache").fetchone()
    assert row is not None
    return int(row["n"])


def test_ingest_and_delete_cycles_leave_no_cached_vectors(any_service: RagService) -> None:
    """Operations tester: 40 documents ingested and deleted per cycle grew the SQLite file 24.6 -> 69 MB.

    Each cycle left about 50 rows per document (chunks, NodeRAG sentences, GraphRAG names) in the cache.
    """
    corpus = _corpus(9)
    for cycle in range(3):
        batch = corpus[cycle * 3 : (cycle + 1) * 3]
        ingested = any_service.ingest({"collection_id": "g", "documents": batch})
        assert ingested["document_ids"] == [d["id"] for d in batch]
        assert _cache_rows(any_service) > len(batch)  # chunks, sentences and names
        deleted = any_service.delete_documents(
            {"collection_id": "g", "document_ids": [d["id"] for d in batch]}
        )
        assert deleted["deleted_count"] == len(batch)
        assert _cache_rows(any_service) == 0, f"cycle {cycle}"


def test_deleting_a_collection_drops_its_cached_vectors(any_service: RagService) -> None:
    any_service.ingest({"collection_id": "kept", "documents": _corpus(1)})
    kept = _cache_rows(any_service)
    any_service.ingest({"collection_id": "gone", "documents": _corpus(4)[1:]})
    assert _cache_rows(any_service) > kept
    any_service.delete_collection({"collection_id": "gone", "confirm_collection_id": "gone"})
    assert _cache_rows(any_service) == kept


def test_replacing_a_document_drops_its_old_texts_and_a_reindex_embeds_nothing(
    any_service: RagService,
) -> None:
    first, second = _corpus(2)
    any_service.ingest({"collection_id": "r", "documents": [{**second, "id": "same"}]})
    only_second = _cache_rows(any_service)
    any_service.delete_collection({"collection_id": "r", "confirm_collection_id": "r"})
    assert _cache_rows(any_service) == 0
    any_service.ingest({"collection_id": "r", "documents": [{**first, "id": "same"}]})
    any_service.ingest({"collection_id": "r", "documents": [{**second, "id": "same"}]})
    assert _cache_rows(any_service) == only_second
    # The same text again (a reindex) keeps its vectors: nothing is embedded a second time.
    for _ in range(2):
        summary = any_service.reindex("r")
        assert summary["embeddings_reused"] == summary["chunks"]
        assert _cache_rows(any_service) == only_second

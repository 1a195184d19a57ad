"""The store's own records: collections and their counts, the call log, the embedding cache, stats."""

from __future__ import annotations

import numpy as np

from iris_rag.stores.base import CacheItem, CacheOwner, CallFilter, CallRecord, DocumentStore
from tests.backends.contract.corpus import MODEL, document, new_collection, unit_vector


def test_list_collections_with_counts(store: DocumentStore) -> None:
    assert store.list_collections() == []
    assert store.get_collection("c") is None
    new_collection(store, "c")
    new_collection(store, "b")
    store.upsert_documents("c", [document("x", ["one", "two", "three"]), document("y", ["four"])])
    collections = store.list_collections()
    assert [(c.id, c.document_count, c.chunk_count) for c in collections] == [("b", 0, 0), ("c", 2, 4)]
    assert all(c.embedding_model == MODEL and c.created_at and c.updated_at for c in collections)
    assert store.delete_document("c", "x")
    info = store.get_collection("c")
    assert info is not None and (info.document_count, info.chunk_count) == (1, 1)
    assert info.version == store.data_version("c")


def test_data_version_moves_on_every_write_and_delete(store: DocumentStore) -> None:
    new_collection(store)
    seen = {store.data_version("c")}
    store.upsert_documents("c", [document("a", ["alpha"])])
    seen.add(store.data_version("c"))
    store.upsert_documents("c", [document("a", ["alpha again"])])
    seen.add(store.data_version("c"))
    assert store.delete_document("c", "a")
    seen.add(store.data_version("c"))
    assert len(seen) == 4
    # Reading changes nothing.
    store.vector_search("c", unit_vector(1), 3)
    assert store.data_version("c") in seen and store.data_version("c") == store.data_version("c")


def record(timestamp: float, tool: str = "rag_basic", success: bool = True) -> CallRecord:
    return CallRecord(timestamp, tool, "basic" if tool == "rag_basic" else None, 12.5, success, None)


def test_call_log_order_and_window(store: DocumentStore) -> None:
    failed = CallRecord(1_000.0, "rag_ingest", None, 3.25, False, "INVALID_PARAMETERS")
    # Recorded out of order: read back by time.
    for r in (record(1_002.0), failed, record(1_001.5, "rag_health"), record(999.0)):
        store.record_call(r)
    assert store.calls_since(1_000.0) == [failed, record(1_001.5, "rag_health"), record(1_002.0)]
    assert store.calls_since(0) == [record(999.0), failed, record(1_001.5, "rag_health"), record(1_002.0)]
    assert store.calls_since(1_001.5) == [record(1_001.5, "rag_health"), record(1_002.0)]
    assert store.calls_since(1_002.5) == []


def test_a_call_record_keeps_the_callers_ids(store: DocumentStore) -> None:
    """The caller's request_id and session_id are stored with the call (README: rag_metrics recent_calls)."""
    named = CallRecord(1_000.0, "rag_basic", "basic", 9.0, True, None, "alice", "req-7", "session-1")
    store.record_call(named)
    store.record_call(record(1_001.0))
    assert store.calls_since(0) == [named, record(1_001.0)]
    assert store.recent_calls(CallFilter(0), 5) == [record(1_001.0), named]
    assert store.recent_calls(CallFilter(0, principal="alice"), 5) == [named]


def test_embedding_cache_round_trip(store: DocumentStore) -> None:
    h1, h2, h3 = (bytes([i]) * 32 for i in (1, 2, 3))
    v1, v2 = unit_vector(1, 384), unit_vector(2, 384)
    assert store.cached_embeddings("m", [h1]) == {}
    store.cache_embeddings("m", [(h1, v1, None), (h2, v2, None)])
    store.cache_embeddings("m", [])
    found = store.cached_embeddings("m", [h1, h2, h3])
    assert set(found) == {h1, h2}
    assert np.array_equal(found[h1], v1) and np.array_equal(found[h2], v2)
    assert found[h1].dtype == np.float32
    # Keyed by model too: another model's vectors for the same text are apart.
    assert store.cached_embeddings("other", [h1, h2]) == {}
    store.cache_embeddings("other", [(h1, v2, None)])
    assert np.array_equal(store.cached_embeddings("other", [h1])[h1], v2)
    assert np.array_equal(store.cached_embeddings("m", [h1])[h1], v1)
    # Caching a hash again keeps one entry, the latest vector.
    store.cache_embeddings("m", [(h1, v2, None)])
    assert np.array_equal(store.cached_embeddings("m", [h1])[h1], v2)
    # Many hashes at once (more than one batch of parameters).
    many: list[CacheItem] = [(i.to_bytes(32, "big"), unit_vector(i, 4), None) for i in range(1_200)]
    store.cache_embeddings("many", many)
    assert len(store.cached_embeddings("many", [h for h, _, _ in many])) == 1_200


def test_cached_vectors_go_with_the_document_that_owns_them(store: DocumentStore) -> None:
    """A deleted document's vectors, or a replaced one's made for its old text, left the cache never."""
    new_collection(store, "c")
    new_collection(store, "d")
    x, y, other = document("x", ["ex"]), document("y", ["why"]), document("z", ["zed"])
    store.upsert_documents("c", [x, y])
    store.upsert_documents("d", [other])
    hashes = [bytes([i]) * 16 for i in range(6)]
    owners = [CacheOwner.of("c", x), CacheOwner.of("c", y), CacheOwner.of("d", other), None]
    items: list[CacheItem] = [
        (h, unit_vector(i, 4), o) for i, (h, o) in enumerate(zip(hashes[:4], owners, strict=True))
    ]
    store.cache_embeddings("m", items)
    # A text cached again keeps its first owner: y's vector is x's to delete.
    store.cache_embeddings("m", [(hashes[0], unit_vector(0, 4), CacheOwner.of("c", y))])
    assert store.delete_document("c", "x")
    assert set(store.cached_embeddings("m", hashes)) == set(hashes[1:4])
    # Replaced by the same text (a reindex), y keeps its vectors; by other text, they go.
    store.upsert_documents("c", [y])
    assert set(store.cached_embeddings("m", hashes)) == set(hashes[1:4])
    store.cache_embeddings("m", [(hashes[4], unit_vector(4, 4), CacheOwner.of("c", document("y", ["new"])))])
    store.upsert_documents("c", [document("y", ["new"])])
    assert set(store.cached_embeddings("m", hashes)) == {hashes[2], hashes[3], hashes[4]}
    assert store.delete_collection("c") == 1
    assert set(store.cached_embeddings("m", hashes)) == {hashes[2], hashes[3]}  # d's, and no document's


def test_stats_counts(store: DocumentStore) -> None:
    store.ping()
    stats = store.stats()
    assert {"backend", "collections", "documents", "chunks", "technique_indexes"} <= stats.keys()
    assert stats["backend"] == store.backend_name
    assert (stats["collections"], stats["documents"], stats["chunks"]) == (0, 0, 0)
    new_collection(store, "c")
    new_collection(store, "d")
    store.upsert_documents("c", [document("x", ["one", "two"])])
    store.upsert_documents("d", [document("x", ["one"]), document("y", ["two"])])
    stats = store.stats()
    assert (stats["collections"], stats["documents"], stats["chunks"]) == (2, 3, 4)
    assert stats["technique_indexes"] == {}


def test_reads_of_a_missing_collection_are_empty(store: DocumentStore) -> None:
    """Every read of a collection that does not exist answers empty, never with a driver error."""
    assert store.get_collection("absent") is None
    assert store.term_document_counts("absent") == {}
    assert store.document_ids("absent") == []
    assert store.chunk_count("absent") == 0
    assert store.get_chunks("absent", ["x#0"]) == []

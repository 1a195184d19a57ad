"""Dense search against NumPy: the exact top-k on random unit vectors, and recall where a backend uses ANN."""

from __future__ import annotations

import numpy as np
import pytest

from iris_rag.stores.base import ChunkInput, DocumentInput, DocumentStore
from tests.backends.contract.conftest import Backend
from tests.backends.contract.corpus import MODEL, Vector, unit_rows

TOP_K = 10


def load(store: DocumentStore, matrix: Vector, batch: int = 1_000) -> list[str]:
    """One single-chunk document per row, in batches as an ingest writes them; the chunk ids in row order."""
    store.create_collection("c", MODEL, matrix.shape[1])
    for start in range(0, len(matrix), batch):
        documents = [
            DocumentInput(f"d{i}", "", text, {"row": i}, [ChunkInput(0, text, 0, len(text), matrix[i])])
            for i in range(start, min(start + batch, len(matrix)))
            for text in [f"row {i}"]
        ]
        store.upsert_documents("c", documents)
    return [f"d{i}#0" for i in range(len(matrix))]


def exact_top_k(matrix: Vector, query: Vector, k: int) -> list[int]:
    scores = matrix @ query
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


def test_dense_top_k_is_the_exact_top_k(store: DocumentStore) -> None:
    matrix = unit_rows(2_000, 384, seed=1)
    chunk_ids = load(store, matrix)
    assert store.chunk_count("c") == 2_000
    for query in unit_rows(20, 384, seed=2):
        expected = exact_top_k(matrix, query, TOP_K)
        hits = store.vector_search("c", query, TOP_K)
        assert [h.chunk_id for h in hits] == [chunk_ids[i] for i in expected]
        assert [h.score for h in hits] == pytest.approx(
            [float(matrix[i] @ query) for i in expected], abs=1e-5
        )
        scores = store.vector_scores("c", query, [chunk_ids[i] for i in expected])
        assert scores == {chunk_ids[i]: pytest.approx(float(matrix[i] @ query), abs=1e-5) for i in expected}


def test_top_k_larger_than_the_collection_returns_everything_best_first(store: DocumentStore) -> None:
    matrix = unit_rows(7, 16, seed=3)
    chunk_ids = load(store, matrix)
    query = unit_rows(1, 16, seed=4)[0]
    hits = store.vector_search("c", query, 50)
    assert [h.chunk_id for h in hits] == [chunk_ids[i] for i in exact_top_k(matrix, query, 7)]
    assert store.vector_search("empty", query, 5) == []


def test_ann_recall(store: DocumentStore, backend: Backend) -> None:
    """Recall@10 over queries near stored rows (as real queries are near their answers), against NumPy."""
    dimension = 384
    matrix = unit_rows(backend.ann_rows, dimension, seed=5)
    chunk_ids = load(store, matrix, batch=2_000)
    rng = np.random.default_rng(6)
    near = matrix[rng.choice(len(matrix), 50, replace=False)] + rng.normal(0, 0.05, (50, dimension))
    queries = (near / np.linalg.norm(near, axis=1, keepdims=True)).astype(np.float32)
    found = 0
    for query in queries:
        expected = {chunk_ids[i] for i in exact_top_k(matrix, query, TOP_K)}
        found += len(expected & {h.chunk_id for h in store.vector_search("c", query, TOP_K)})
    recall = found / (TOP_K * len(queries))
    assert recall >= backend.min_recall, f"recall@{TOP_K} {recall:.3f} on {backend.ann_rows} rows"


def test_stored_vectors_read_back_bit_for_bit(store: DocumentStore) -> None:
    """chunk_vectors (what `iris-rag migrate` copies) gives each chunk's vector exactly as written."""
    matrix = unit_rows(30, 24, seed=9)
    chunk_ids = load(store, matrix, batch=7)
    store.delete_document("c", "d3")
    asked = [chunk_ids[12], "nope#0", chunk_ids[3], chunk_ids[0]]
    vectors = store.chunk_vectors("c", asked)
    assert list(vectors) in ([chunk_ids[12], chunk_ids[0]], [chunk_ids[0], chunk_ids[12]])
    for row in (0, 12):
        assert vectors[chunk_ids[row]].dtype == np.float32
        assert vectors[chunk_ids[row]].tobytes() == matrix[row].astype(np.float32).tobytes()
    assert store.chunk_vectors("c", []) == {} and store.chunk_vectors("missing", chunk_ids[:2]) == {}

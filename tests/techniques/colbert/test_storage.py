"""rag_colbert's storage contract, driven through store.technique_storage on each backend."""

from __future__ import annotations

import numpy as np
import pytest

from iris_rag.stores.base import DocumentStore
from iris_rag.techniques.colbert.storage import TokenRow, TokenVectorStorage


@pytest.fixture
def store(any_store: DocumentStore) -> DocumentStore:
    return any_store


def _row(chunk_id: str, document_id: str, ids: list[int]) -> TokenRow:
    codes = np.arange(len(ids) * 4, dtype=np.int8).tobytes()
    return TokenRow(chunk_id, document_id, len(ids), 4, 0.5, np.array(ids, np.uint16).tobytes(), codes)


def test_rows_and_frequencies_round_trip(store: DocumentStore) -> None:
    rows = store.technique_storage(TokenVectorStorage)
    assert store.technique_storage(TokenVectorStorage) is rows, "one storage per store"
    rows.insert("c", [_row("a#0", "a", [5, 7]), _row("a#1", "a", [7]), _row("b#0", "b", [9])])
    rows.insert("other", [_row("a#0", "a", [5])])
    rows.add_frequencies("c", {5: 1, 7: 2, 9: 1})
    loaded = {r.chunk_id: r for r in rows.load("c", ["a#0", "b#0", "missing#0"])}
    assert set(loaded) == {"a#0", "b#0"}
    assert loaded["a#0"] == _row("a#0", "a", [5, 7]), "bytes, scale and dimension come back as written"
    assert rows.frequencies("c") == (3, {5: 1, 7: 2, 9: 1})
    assert rows.indexed_documents("c") == 2
    assert sorted(rows.document_token_ids("c", "a")) == sorted(
        [np.array([5, 7], np.uint16).tobytes(), np.array([7], np.uint16).tobytes()]
    )

    rows.add_frequencies("c", {5: -1, 7: -2})
    rows.delete_document("c", "a")
    assert rows.frequencies("c") == (1, {9: 1}), "counts that reach zero go"
    assert rows.load("c", ["a#0", "a#1"]) == []
    assert rows.load("other", ["a#0"]) != [], "another collection's rows stay"
    totals = rows.totals()
    assert (totals.chunks, totals.documents, totals.tokens) == (2, 2, 2)
    assert totals.bytes > 0


def test_many_chunk_ids_load_in_batches(store: DocumentStore) -> None:
    rows = store.technique_storage(TokenVectorStorage)
    rows.insert("c", [_row(f"d{i}#0", f"d{i}", [i]) for i in range(1200)])
    assert len(rows.load("c", [f"d{i}#0" for i in range(1200)])) == 1200

"""Documents in and out: add, replace, delete, and every ingest all-or-nothing, with its technique rows."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.errors import RequestCancelledError
from iris_rag.stores.base import DocumentInput, DocumentStore, KeywordQuery, NewCollection
from tests.backends.contract.corpus import DIM, MODEL, document, new_collection, unit_vector


class WordCountIndex:
    """A test double of a technique index: one row per document (its word count), kept in memory.

    It holds no storage of its own, so what it shows is which calls the store makes: prepare outside
    the transaction, write after the documents, delete before a replaced or deleted document goes.
    """

    name = "word_count"

    def __init__(self, fail_on: str | None = None) -> None:
        self.rows: dict[tuple[str, str], int] = {}
        self.fail_on = fail_on

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> dict[str, int]:
        return {d.id: len(d.content.split()) for d in documents}

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        if self.fail_on in prepared:
            raise RuntimeError("index failure")
        for document_id, count in prepared.items():
            assert (collection_id, document_id) not in self.rows, "a replaced document's rows go first"
            self.rows[collection_id, document_id] = count

    def delete(self, collection_id: str, document_id: str) -> None:
        self.rows.pop((collection_id, document_id), None)

    def stats(self) -> dict[str, Any]:
        return {"rows": len(self.rows)}

    def indexed_documents(self, collection_id: str) -> int:
        return sum(c == collection_id for c, _ in self.rows)


def ingest(store: DocumentStore, index: WordCountIndex, documents: list[DocumentInput], **kw: Any) -> int:
    """Upsert as the ingestor does: prepare first, then one transaction."""
    return store.upsert_documents("c", documents, {index.name: index.prepare("c", documents)}, **kw)


def keyword_ids(store: DocumentStore, term: str) -> list[str]:
    return [h.chunk_id for h in store.keyword_search("c", KeywordQuery.of([term]), 50)]


def test_add_then_read_back(store: DocumentStore) -> None:
    new_collection(store)
    doc = document("a", ["alpha one two", "beta three"], "the title", {"year": 2020})
    assert store.upsert_documents("c", [doc]) == 2
    stored = store.get_document("c", "a")
    assert stored is not None
    assert (stored.id, stored.collection_id, stored.title, stored.content, stored.metadata) == (
        "a",
        "c",
        "the title",
        "alpha one two beta three",
        {"year": 2020},
    )
    assert stored.created_at and stored.updated_at
    chunks = store.get_document_chunks("c", "a")
    assert [(k.chunk_id, k.index, k.content, k.start_char, k.end_char) for k in chunks] == [
        ("a#0", 0, "alpha one two", 0, 13),
        ("a#1", 1, "beta three", 14, 24),
    ]
    assert {k.title for k in chunks} == {"the title"}
    assert all(k.document_id == "a" and k.metadata == {"year": 2020} for k in chunks)
    assert store.get_document("c", "missing") is None
    assert store.get_document("other", "a") is None


def test_replace_keeps_one_copy_and_takes_old_chunks_keyword_and_index_rows(store: DocumentStore) -> None:
    new_collection(store)
    index = WordCountIndex()
    store.register_index(index)
    v_old, v_new = unit_vector(1), unit_vector(2)
    ingest(store, index, [document("a", ["oldword one", "oldword two", "three"], vectors=[v_old] * 3)])
    ingest(store, index, [document("b", ["other text"])])
    created = store.get_document("c", "a")
    assert created is not None

    assert ingest(store, index, [document("a", ["newword one"], "new", vectors=[v_new])]) == 1
    assert sorted(store.document_ids("c")) == ["a", "b"]
    assert [k.chunk_id for k in store.get_document_chunks("c", "a")] == ["a#0"]
    assert store.get_chunks("c", ["a#1", "a#2"]) == []
    assert keyword_ids(store, "oldword") == []
    assert keyword_ids(store, "newword") == ["a#0"]
    assert index.rows == {("c", "a"): 2, ("c", "b"): 2}
    replaced = store.get_document("c", "a")
    assert replaced is not None and replaced.title == "new" and replaced.created_at == created.created_at
    # The old vectors are gone from dense search: only one chunk of "a" is left, the new one.
    hits = store.vector_search("c", v_old, 10)
    assert sorted(h.chunk_id for h in hits) == ["a#0", "b#0"]
    assert store.vector_scores("c", v_new, ["a#0"]) == {"a#0": pytest.approx(1.0, abs=1e-5)}
    info = store.get_collection("c")
    assert info is not None and (info.document_count, info.chunk_count) == (2, 2)
    assert store.chunk_count("c") == 2


@pytest.mark.parametrize("chunks", [1, 500], ids=["row", "bulk"])  # 500: PostgreSQL's COPY path too
def test_updated_at_moves_only_when_title_content_or_metadata_change(
    store: DocumentStore, chunks: int
) -> None:
    """A reindex rewrites every document as it is: its dates must not say it was edited."""
    new_collection(store)
    words = [f"word{i}" for i in range(chunks)]
    store.upsert_documents("c", [document("a", words, "title", {"year": 2020, "tags": ["x"]})])
    first = store.get_document("c", "a")
    assert first is not None
    time.sleep(0.01)  # the stores' timestamps have millisecond resolution
    store.upsert_documents("c", [document("a", words, "title", {"tags": ["x"], "year": 2020})])
    same = store.get_document("c", "a")
    assert same is not None and (same.created_at, same.updated_at) == (first.created_at, first.updated_at)
    for edited in (
        document("a", words, "new title", {"year": 2020, "tags": ["x"]}),
        document("a", [*words[:-1], "changed"], "new title", {"year": 2020, "tags": ["x"]}),
        document("a", [*words[:-1], "changed"], "new title", {"year": 2021, "tags": ["x"]}),
    ):
        before = store.get_document("c", "a")
        assert before is not None
        time.sleep(0.01)
        store.upsert_documents("c", [edited])
        after = store.get_document("c", "a")
        assert after is not None and after.created_at == first.created_at
        assert after.updated_at > before.updated_at


def test_delete_takes_chunks_keyword_vector_and_index_rows(store: DocumentStore) -> None:
    new_collection(store)
    index = WordCountIndex()
    store.register_index(index)
    ingest(store, index, [document("a", ["alpha one", "alpha two"]), document("b", ["beta one"])])
    assert store.delete_document("c", "a")
    assert not store.delete_document("c", "a")
    assert not store.delete_document("c", "never")
    assert store.get_document("c", "a") is None
    assert store.get_document_chunks("c", "a") == []
    assert keyword_ids(store, "alpha") == []
    assert keyword_ids(store, "one") == ["b#0"]
    assert [h.chunk_id for h in store.vector_search("c", unit_vector(3), 10)] == ["b#0"]
    assert store.vector_scores("c", unit_vector(3), ["a#0", "a#1"]) == {}
    assert index.rows == {("c", "b"): 2}
    assert store.stats()["technique_indexes"] == {"word_count": {"rows": 1}}
    assert store.document_ids("c") == ["b"]
    info = store.get_collection("c")
    assert info is not None and (info.document_count, info.chunk_count) == (1, 1)


def test_documents_of_one_collection_never_touch_another(store: DocumentStore) -> None:
    new_collection(store, "c")
    new_collection(store, "d")
    store.upsert_documents("c", [document("a", ["alpha in c"])])
    store.upsert_documents("d", [document("a", ["alpha in d"])])
    assert store.delete_document("d", "a")
    stored = store.get_document("c", "a")
    assert stored is not None and stored.content == "alpha in c"
    assert keyword_ids(store, "alpha") == ["a#0"]
    assert store.keyword_search("d", KeywordQuery.of(["alpha"]), 5) == []


def test_a_failing_index_write_stores_nothing_of_the_batch(store: DocumentStore) -> None:
    new_collection(store)
    index = WordCountIndex()
    store.register_index(index)
    ingest(store, index, [document("a", ["alpha original"], "first", {"v": 1})])
    before = store.get_document("c", "a")

    index.fail_on = "z"
    batch = [document("a", ["alpha replaced"], "second"), document("z", ["zeta new"])]
    with pytest.raises(RuntimeError, match="index failure"):
        ingest(store, index, batch)
    assert store.get_document("c", "a") == before
    assert store.get_document("c", "z") is None
    assert store.document_ids("c") == ["a"]
    assert [k.content for k in store.get_document_chunks("c", "a")] == ["alpha original"]
    assert keyword_ids(store, "zeta") == [] and keyword_ids(store, "replaced") == []
    assert keyword_ids(store, "original") == ["a#0"]
    assert [h.chunk_id for h in store.vector_search("c", unit_vector(5), 10)] == ["a#0"]
    info = store.get_collection("c")
    assert info is not None and (info.document_count, info.chunk_count) == (1, 1)


def test_a_failed_first_ingest_leaves_no_collection(store: DocumentStore) -> None:
    index = WordCountIndex(fail_on="a")
    store.register_index(index)
    with pytest.raises(RuntimeError, match="index failure"):
        ingest(store, index, [document("a", ["alpha"])], new_collection=NewCollection(MODEL, DIM))
    assert store.get_collection("c") is None
    assert [c.id for c in store.list_collections()] == []
    assert store.document_ids("c") == []
    # The same first ingest, once the index works, creates the collection with its documents.
    index.fail_on = None
    ingest(store, index, [document("a", ["alpha"])], new_collection=NewCollection(MODEL, DIM))
    info = store.get_collection("c")
    assert info is not None and (info.embedding_model, info.dimension, info.document_count) == (MODEL, DIM, 1)


def test_writes_inside_one_transaction_commit_together_or_not_at_all(store: DocumentStore) -> None:
    new_collection(store)
    with pytest.raises(RuntimeError, match="after both writes"), store.transaction():
        store.upsert_documents("c", [document("a", ["alpha"])])
        store.upsert_documents("c", [document("b", ["beta"])])
        raise RuntimeError("after both writes")
    assert store.document_ids("c") == []
    with store.transaction():
        store.upsert_documents("c", [document("a", ["alpha"])])
        store.delete_document("c", "a")
        store.upsert_documents("c", [document("b", ["beta"])])
    assert store.document_ids("c") == ["b"]
    assert keyword_ids(store, "beta") == ["b#0"] and keyword_ids(store, "alpha") == []


def test_new_collection_leaves_an_existing_collection_as_it_was(store: DocumentStore) -> None:
    new_collection(store)
    store.upsert_documents("c", [document("a", ["alpha"])], new_collection=NewCollection("other", 3))
    info = store.get_collection("c")
    assert info is not None and (info.embedding_model, info.dimension, info.document_count) == (MODEL, DIM, 1)


def test_cancellation_before_commit_rolls_the_ingest_back(store: DocumentStore) -> None:
    token = CancelToken()
    token.cancel("cancelled by the test")
    with cancellation_scope(token), pytest.raises(RequestCancelledError):
        store.upsert_documents("c", [document("a", ["alpha"])], new_collection=NewCollection(MODEL, DIM))
    assert store.get_collection("c") is None

    store.upsert_documents("c", [document("a", ["alpha kept"])], new_collection=NewCollection(MODEL, DIM))
    with cancellation_scope(token), pytest.raises(RequestCancelledError):
        store.upsert_documents("c", [document("a", ["alpha lost"]), document("b", ["beta"])])
    assert store.document_ids("c") == ["a"]
    assert [k.content for k in store.get_document_chunks("c", "a")] == ["alpha kept"]
    assert keyword_ids(store, "lost") == [] and keyword_ids(store, "beta") == []
    # Outside the cancelled request the store works on.
    store.upsert_documents("c", [document("b", ["beta"])])
    assert store.document_ids("c") == ["a", "b"]


def test_document_ids_keep_insertion_order_and_get_chunks_the_order_asked(store: DocumentStore) -> None:
    new_collection(store)
    ids = ["m", "b", "z", "a"]
    store.upsert_documents("c", [document(i, [f"text {i}", f"more {i}"]) for i in ids])
    assert store.document_ids("c") == ids
    asked = ["z#1", "a#0", "nope#0", "m#1", "z#0"]
    assert [k.chunk_id for k in store.get_chunks("c", asked)] == ["z#1", "a#0", "m#1", "z#0"]
    assert store.get_chunks("c", []) == []
    assert [k.index for k in store.get_document_chunks("c", "b")] == [0, 1]
    assert store.document_ids("nope") == []


def test_vectors_come_back_as_stored(store: DocumentStore) -> None:
    new_collection(store)
    vectors = [unit_vector(i) for i in range(3)]
    store.upsert_documents("c", [document("a", ["x", "y", "z"], vectors=vectors)])
    for i, v in enumerate(vectors):
        scores = store.vector_scores("c", v, ["a#0", "a#1", "a#2"])
        expected = {f"a#{j}": float(np.dot(vectors[j], v)) for j in range(3)}
        assert scores == {k: pytest.approx(e, abs=1e-5) for k, e in expected.items()}
        assert store.vector_search("c", v, 1)[0].chunk_id == f"a#{i}"


def test_index_transaction_moves_the_version_and_waits_for_the_collections_writers(
    store: DocumentStore,
) -> None:
    """Technique rows written after the documents' commit (INDEX_BUILD=background)."""
    index = WordCountIndex()
    store.register_index(index)
    new_collection(store)
    doc = document("a", ["alpha one two"])
    store.upsert_documents("c", [doc])  # the core only: no index rows
    assert index.rows == {}
    before = store.data_version("c")
    stored = store.get_document("c", "a")
    written = ["a"]
    with store.index_transaction("c", written):
        index.write("c", [doc], index.prepare("c", [doc]))
    assert index.rows == {("c", "a"): 3}
    assert store.data_version("c") > before  # caches keyed on the version see the new rows
    assert store.get_document("c", "a") == stored  # the document itself is untouched
    moved = store.data_version("c")
    with store.index_transaction("c", []):
        pass
    assert store.data_version("c") == moved  # nothing written, nothing moved

    # An upsert of the collection on another thread waits until the index transaction commits.
    entered, order = threading.Event(), []

    def replace() -> None:
        entered.wait(10)
        store.upsert_documents("c", [document("a", ["alpha replaced"])])
        order.append("upsert")

    writer = threading.Thread(target=replace)
    writer.start()
    with store.index_transaction("c", written):
        entered.set()
        time.sleep(0.5)
        order.append("index")
    writer.join(30)
    assert order == ["index", "upsert"]
    assert index.rows == {}  # the replace, once it ran, took the document's rows


def test_collection_transaction_waits_for_the_collections_writers_and_holds_theirs(
    store: DocumentStore,
) -> None:
    """What a writer checks inside it (reindex, sync) is still so when its own writes, inside too, commit."""
    new_collection(store)
    store.upsert_documents("c", [document("a", ["alpha one"])])
    entered, order = threading.Event(), []

    def replace() -> None:
        entered.wait(10)
        store.upsert_documents("c", [document("a", ["alpha replaced"])])
        order.append("upsert")

    writer = threading.Thread(target=replace)
    writer.start()
    with store.collection_transaction("c"):
        entered.set()
        time.sleep(0.5)
        held = store.get_document("c", "a")
        assert held is not None and held.content == "alpha one"
        assert store.delete_document("c", "a")  # joins the block's transaction
        order.append("checked")
    writer.join(30)
    assert order == ["checked", "upsert"]
    replaced = store.get_document("c", "a")
    assert replaced is not None and replaced.content == "alpha replaced"

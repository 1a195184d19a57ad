"""Derived state follows writes document by document: the change log, NodeRAG's leaves, GraphRAG's entities.

The store names the documents each data version changed (DocumentStore.changed_documents); a process holding
NodeRAG's leaf matrix or GraphRAG's entity table of an older version reads only those documents' rows. Two
services on one store stand for two processes (the server's worker and `iris-rag ingest`). After each write
the reader's value must equal one loaded afresh, and it must have been updated, not loaded whole again,
except where a write took something away from what it holds (GraphRAG: a covered document rewritten or
deleted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from iris_rag.embedder import Embedder
from iris_rag.service import RagService
from iris_rag.stores.base import ChunkInput, DocumentInput, DocumentStore
from iris_rag.techniques.graphrag import index as graph_module
from iris_rag.techniques.graphrag.index import EntityTable, KnowledgeGraphIndex
from iris_rag.techniques.noderag.index import NodeTreeIndex
from iris_rag.techniques.noderag.storage import LeafMatrix

DIM = 8


def _document(doc_id: str, seed: int) -> DocumentInput:
    vector = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    chunk = ChunkInput(0, f"{doc_id} text", 0, 1, vector / np.linalg.norm(vector))
    return DocumentInput(doc_id, "", f"{doc_id} text", {}, [chunk])


def test_the_change_log_names_the_documents_each_version_changed(any_store: DocumentStore) -> None:
    store = any_store
    store.create_collection("c", "model", DIM)
    store.upsert_documents("c", [_document("a", 1), _document("b", 2)])
    first = store.data_version("c")
    assert store.changed_documents("c", 0, first, 10) == {"a", "b"}

    store.upsert_documents("c", [_document("c", 3)])
    assert store.delete_document("c", "a")
    now = store.data_version("c")
    assert store.changed_documents("c", first, now, 10) == {"a", "c"}
    assert store.changed_documents("c", now, now, 10) == set()
    assert store.changed_documents("c", first, now, 1) is None, "over the limit: the caller reloads"

    store.delete_collection("c")
    store.create_collection("c", "model", DIM)
    store.upsert_documents("c", [_document("d", 4)])
    later = store.data_version("c")
    assert later > now, "versions never repeat"
    assert store.changed_documents("c", now, later, 10) is None, "the deleted collection's log went: a gap"
    assert store.changed_documents("c", later - 1, later, 10) == {"d"}


class _Spy:
    """Delegates to the real storage, recording which documents each read of `method` asked for."""

    def __init__(self, storage: Any, method: str, argument: int) -> None:
        self._storage, self._method, self._argument = storage, method, argument
        self.reads: list[set[str] | None] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._storage, name)
        if name != self._method:
            return real

        def read(*args: Any) -> Any:
            self.reads.append(args[self._argument] if len(args) > self._argument else None)
            return real(*args)

        return read


@pytest.fixture
def pair(any_service: RagService, embedder: Embedder) -> Iterator[tuple[RagService, RagService]]:
    """A reader and a writer: two services on one store (SQLite: one file; PostgreSQL: one database)."""
    reader = RagService(any_service.settings, embedder=embedder)
    yield reader, any_service
    reader.close()


TOPICS = [
    ("aspirin", "Aspirin (acetylsalicylic acid) lowers the risk of myocardial infarction in older adults."),
    ("statins", "Statins lower LDL cholesterol and the risk of myocardial infarction."),
    ("tnf", "Tumor necrosis factor (TNF) drives inflammation in rheumatoid arthritis."),
    ("insulin", "Insulin resistance precedes type 2 diabetes; metformin lowers hepatic glucose output."),
    ("arthritis", "TNF inhibitors reduce joint damage in rheumatoid arthritis, as methotrexate does."),
    ("diabetes", "Metformin and statins are prescribed together in type 2 diabetes."),
]


def _ingest(service: RagService, *names: str, suffix: str = "") -> None:
    documents = [
        {"id": name, "title": name.title(), "content": text + suffix}
        for name, text in TOPICS
        if name in names
    ]
    service.ingest({"collection_id": "docs", "documents": documents})


def _leaves(service: RagService) -> NodeTreeIndex:
    index = service.pipelines["noderag"].technique_index()
    assert isinstance(index, NodeTreeIndex)
    return index


def _same_leaves(got: LeafMatrix, fresh: LeafMatrix) -> None:
    assert got.document_ids == fresh.document_ids
    np.testing.assert_array_equal(got.node_ids, fresh.node_ids)
    np.testing.assert_array_equal(got.parent_ids, fresh.parent_ids)
    np.testing.assert_array_equal(got.matrix, fresh.matrix)


def test_a_held_leaf_matrix_reads_only_the_documents_written_since(
    pair: tuple[RagService, RagService],
) -> None:
    reader, writer = pair
    _ingest(writer, "aspirin", "statins", "tnf")
    index = _leaves(reader)
    spy = _Spy(index.storage, "leaves", 1)
    index.storage = spy
    fresh = _leaves(writer).storage

    steps: list[Callable[[], object]] = [
        lambda: _ingest(writer, "insulin"),  # a new document
        lambda: _ingest(writer, "arthritis", "diabetes"),  # two in one write
        lambda: _ingest(writer, "statins", suffix=" Rhabdomyolysis is rare."),  # one written again
        lambda: writer.store.delete_document("docs", "aspirin"),
        lambda: None,  # no write: the held matrix as it is
    ]
    held = index.leaf_matrix("docs", reader.store.data_version("docs"))
    _same_leaves(held, fresh.leaves("docs"))
    for step in steps:
        step()
        got = index.leaf_matrix("docs", reader.store.data_version("docs"))
        _same_leaves(got, fresh.leaves("docs"))
    assert spy.reads[0] is None, "loaded whole once"
    assert all(read is not None for read in spy.reads[1:]), spy.reads
    assert set().union(*(read or set() for read in spy.reads[1:])) == {
        "insulin",
        "arthritis",
        "diabetes",
        "statins",
        "aspirin",
    }


def test_leaf_versions_made_from_an_older_one_keep_their_own_rows() -> None:
    def matrix(document: str, rows: int, start: float) -> LeafMatrix:
        values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + start
        ids = np.arange(rows, dtype=np.int64)
        return LeafMatrix([document] * rows, ids, ids, values)

    base = matrix("a", 3, 0)
    first = base.replaced({"b"}, matrix("b", 2, 100))  # grows the storage with room to spare
    second = first.replaced({"c"}, matrix("c", 1, 200))  # the newest version: appends in place
    again = first.replaced({"d"}, matrix("d", 2, 300))  # from an older version: must not overwrite `second`
    assert second.rows is first.rows and again.rows is not first.rows
    assert second.document_ids == ["a"] * 3 + ["b"] * 2 + ["c"]
    assert second.matrix[5].tolist() == [200, 201] and again.matrix[5].tolist() == [300, 301]
    dropped = second.replaced({"b"}, matrix("b", 1, 400))  # a document rewritten: its old rows go
    assert dropped.document_ids == ["a"] * 3 + ["c", "b"]
    assert dropped.matrix[3:].tolist() == [[200, 201], [400, 401]]
    assert second.matrix[3].tolist() == [100, 101], "the version it was made from is untouched"


def _graph(service: RagService) -> KnowledgeGraphIndex:
    index = service.pipelines["graphrag"].technique_index()
    assert isinstance(index, KnowledgeGraphIndex)
    return index


def _same_entities(got: EntityTable, fresh: EntityTable) -> None:
    assert (got.documents, got.rows, got.keys, got.indexed) == (
        fresh.documents,
        fresh.rows,
        fresh.keys,
        fresh.indexed,
    )
    assert got.row_of_id == fresh.row_of_id and got.id_of_key == fresh.id_of_key
    assert {a: sorted(ids) for a, ids in got.ids_of_alias.items()} == {
        a: sorted(ids) for a, ids in fresh.ids_of_alias.items()
    }
    # The embedded names, each with its vector (an update appends names embedded only now at the end).
    assert sorted(got.vector_rows.tolist()) == sorted(fresh.vector_rows.tolist())
    by_row = dict(zip(fresh.vector_rows.tolist(), fresh.vectors, strict=True))
    for row, vector in zip(got.vector_rows.tolist(), got.vectors, strict=True):
        np.testing.assert_array_equal(vector, by_row[row])


@pytest.mark.parametrize("embed_all", [True, False], ids=["every name", "names in 2+ documents"])
def test_a_held_entity_table_reads_only_the_entities_new_documents_mention(
    pair: tuple[RagService, RagService], embed_all: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not embed_all:  # a large graph's rule: only names mentioned in two documents or more are embedded
        monkeypatch.setattr(graph_module, "EMBED_ALL_ENTITIES_UP_TO", 0)
    reader, writer = pair
    _ingest(writer, "aspirin", "statins", "tnf")
    index = _graph(reader)
    spy = _Spy(index.graph, "entities", 2)
    index.graph = spy
    fresh = _graph(writer)

    def check() -> EntityTable:
        got = index.entity_table("docs", reader.store.data_version("docs"))
        _same_entities(got, fresh._load_entities("docs"))
        return got

    check()
    _ingest(writer, "insulin")  # new entities only
    before = check()
    _ingest(writer, "arthritis", "diabetes")  # entities known already (TNF, statins), now in 2 documents
    table = check()
    assert spy.reads[0] is None and spy.reads[1:] == [{"insulin"}, {"arthritis", "diabetes"}], spy.reads
    added = table.vector_rows[len(before.vector_rows) :].tolist()
    assert len(table.vectors) == len(table.vector_rows) and added
    if not embed_all:
        assert any(row < len(before.rows) for row in added), "a known entity's name embedded only now"

    _ingest(writer, "statins", suffix=" Rhabdomyolysis is rare.")  # a covered document written again
    check()
    assert spy.reads[-1] is None, "what the old text mentioned may be gone: loaded whole"
    assert writer.store.delete_document("docs", "tnf")
    check()
    assert spy.reads[-1] is None

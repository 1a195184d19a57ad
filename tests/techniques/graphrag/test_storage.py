"""rag_graphrag's storage contract, driven through store.technique_storage on each backend."""

from __future__ import annotations

import numpy as np
import pytest

from iris_rag.stores.base import DocumentStore
from iris_rag.techniques.graphrag.storage import (
    AliasRow,
    GraphDocument,
    GraphWrite,
    KnowledgeGraphStorage,
    MentionRow,
    NewEvidence,
    NewRelation,
)


@pytest.fixture
def store(any_store: DocumentStore) -> DocumentStore:
    return any_store


def _document(
    graph: KnowledgeGraphStorage, document_id: str, keys: list[str], collection_id: str = "c"
) -> dict[str, int]:
    """Write one document mentioning the keys, with a co_occurs relation between the first two."""
    entities = graph.ensure_entities(collection_id, {k: (k.upper(), "concept") for k in keys})
    ids = {e.key: e.id for e in entities}
    a, b = ids[keys[0]], ids[keys[1]]
    evidence = [NewEvidence(document_id, f"{document_id}#0", 1, "content", 0, 10)]
    graph.add(
        collection_id,
        GraphWrite(
            mentions=[MentionRow(ids[k], document_id, f"{document_id}#0", "content", 0, 3) for k in keys],
            counts={ids[k]: (1, 1) for k in keys},
            relations=[NewRelation(min(a, b), max(a, b), "co_occurs", 1, evidence)],
            aliases=[AliasRow("X", ids[keys[0]], document_id, "X")],
            documents=[GraphDocument(document_id, "rules", len(keys), 1, None)],
        ),
    )
    return ids


def test_write_read_and_delete_keep_counts_in_step(store: DocumentStore) -> None:
    graph = store.technique_storage(KnowledgeGraphStorage)
    first = _document(graph, "d1", ["alpha", "beta"])
    second = _document(graph, "d2", ["alpha", "beta", "gamma"])
    assert first["alpha"] == second["alpha"], "an entity is created once per collection"
    vector = np.arange(4, dtype=np.float32)
    graph.set_entity_vectors([(first["alpha"], vector)])
    assert [e.key for e in graph.ensure_entities("c", {"alpha": ("A", "x")}) if not e.needs_vector] == [
        "alpha"
    ]

    stored = {e.row.key: e for e in graph.entities("c", min_documents=1)}
    assert stored["alpha"].row.document_count == 2 and stored["alpha"].row.mention_count == 2
    assert np.frombuffer(stored["alpha"].vector or b"", dtype=np.float32).tolist() == vector.tolist()
    relations = graph.relations_of("c", [first["alpha"]])
    assert [r.weight for r in relations] == [2], "weights add up over documents"
    assert {e.document_id for e in graph.evidence_of([relations[0].id])} == {"d1", "d2"}
    assert graph.alias_votes("c", ["X"]) == [("X", "alpha", 2)]
    assert graph.counts("c") == {"documents": 2, "entities": 3, "mentions": 5, "relations": 1}
    assert graph.extractor_counts("c") == {"rules": 2}

    assert graph.delete_document("c", "d2")
    assert not graph.delete_document("c", "d2"), "a document the graph does not cover"
    assert graph.counts("c") == {"documents": 1, "entities": 2, "mentions": 2, "relations": 1}
    assert [r.weight for r in graph.relations_of("c", [first["alpha"]])] == [1]
    assert {m.document_id for m in graph.mentions_of([first["alpha"]])} == {"d1"}
    assert graph.indexed_documents("c") == 1

    graph.record("c", "rules", None, "2026-01-01T00:00:00")
    graph.record("c", "rules", None, "2026-01-02T00:00:00")
    record = graph.graph_record("c")
    assert record is not None and record.version == 2 and record.updated_at == "2026-01-02T00:00:00"
    assert graph.graph_record("other") is None


def test_whole_graph_reads_and_collections_stay_apart(store: DocumentStore) -> None:
    """The reads that load a collection's whole graph, and a delete that stays inside its collection."""
    graph = store.technique_storage(KnowledgeGraphStorage)
    ids = _document(graph, "d1", ["alpha", "beta", "gamma"])
    other = _document(graph, "d1", ["alpha", "beta"], collection_id="other")
    assert not set(ids.values()) & set(other.values()), "entities are per collection"
    a, b = ids["alpha"], ids["beta"]
    assert graph.relation_ends("c") == [(min(a, b), max(a, b))]
    assert graph.entity_aliases("c") == [("X", a)]
    assert graph.aliases_of(a) == ["X"] and graph.aliases_of(b) == []

    graph.record("c", "llm", "model-1", "2026-01-01T00:00:00")
    graph.record("c", "rules", None, "2026-01-02T00:00:00")
    graph.record("other", "rules", None, "2026-01-01T00:00:00")
    assert [(c, r.extractor, r.llm_model) for c, r in graph.collections()] == [
        ("c", "rules", "model-1"),
        ("other", "rules", None),
    ], "a record without a model keeps the one before"

    assert graph.delete_document("c", "d1")
    assert graph.counts("c") == {"documents": 0, "entities": 0, "mentions": 0, "relations": 0}
    assert graph.relation_ends("c") == [] and graph.entity_aliases("c") == []
    assert graph.aliases_of(a) == [] and graph.mentions_of(list(ids.values())) == []
    assert graph.counts("other") == {"documents": 1, "entities": 2, "mentions": 2, "relations": 1}
    assert graph.entity_aliases("other") == [("X", other["alpha"])]
    assert {m.document_id for m in graph.mentions_of([other["alpha"]])} == {"d1"}


def test_entity_reads_by_collection_and_by_document(store: DocumentStore) -> None:
    """A collection's entities in id order whatever its share of the table (SQLite scans the table when it
    holds most of it, and goes through the index when it is small); those some documents mention."""
    graph = store.technique_storage(KnowledgeGraphStorage)
    small = _document(graph, "s1", ["alpha", "beta"], collection_id="small")
    big: dict[str, int] = {}
    for number in range(6):
        big |= _document(graph, f"b{number}", [f"k{number}a", f"k{number}b", "shared"], collection_id="big")
    small |= _document(graph, "s2", ["beta", "delta"], collection_id="small")
    assert graph.entity_count("big") == 13 and graph.entity_count("small") == 3
    for collection, ids in (("big", big), ("small", small)):
        read = graph.entities(collection, 2)
        assert [e.row.id for e in read] == sorted(ids.values())
        assert {e.row.key for e in read if e.wanted} == ({"shared"} if collection == "big" else {"beta"})
        assert all(e.vector is None for e in read), "no vector stored yet"
    mentioned = graph.entities("small", 1, {"s2"})
    assert [e.row.key for e in mentioned] == ["beta", "delta"]
    assert mentioned[0].row.document_count == 2
    assert graph.entity_aliases("big", {"b2"}) == [("X", big["k2a"])]

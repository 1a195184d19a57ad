"""rag_hybrid_ifind's rerank "colbert": the fused top re-scored by MaxSim over rag_colbert's token index.

Real store, real model, real token index; the fallbacks when that index is absent or still being built.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.background import IndexBuilder, Job
from iris_rag.retrieval.fusion import FusedScore, late_interaction_rerank
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.colbert.pipeline import batch_maxsim
from iris_rag.techniques.hybrid_ifind import HybridIFindPipeline
from tests.conftest import DOCUMENTS
from tests.techniques.test_hybrid_ifind import EXTRA

QUERY = "Does aspirin cause bleeding in the stomach?"


def _hybrid(service: RagService, params: dict[str, Any], query: str = QUERY) -> dict[str, Any]:
    arguments = {"query": query, "collection_id": "docs", "technique_params": params}
    return service.execute({"technique": "hybrid_ifind", "arguments": arguments})


@pytest.fixture
def ingested(service: RagService) -> RagService:
    """Every technique served (the default), indexes built inline: the token index covers the collection."""
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    return service


def _fused(chunk_id: str, dense: float, keyword: float | None, first: float) -> FusedScore:
    return FusedScore(chunk_id, dense, keyword, 0.0, 0.0, None, None, first)


def test_late_interaction_rerank_reorders_by_equal_thirds() -> None:
    first = [
        _fused("a", 0.9, 10.0, 0.9),
        _fused("b", 0.8, 5.0, 0.6),
        _fused("c", 0.5, None, 0.4),
        _fused("z", 0.1, 1.0, 0.2),
    ]
    reranked = late_interaction_rerank(first, {"a": 0.2, "b": 0.9, "c": 0.95}, depth=3)
    # Over a, b, c only: dense min-max (1, .75, 0), BM25 / best (1, .5, 0), MaxSim min-max (0, .933, 1).
    assert [r.chunk_id for r in reranked] == ["b", "a", "c", "z"]
    assert reranked[0].score == pytest.approx((0.75 + 0.5 + 0.7 / 0.75) / 3)
    assert reranked[1].score == pytest.approx(2 / 3) and reranked[1].late_norm == 0.0
    assert reranked[2].score == pytest.approx(1 / 3)
    # Past the depth: the fusion's order, scaled under the head (its first-pass score x (1/3) / 0.4).
    assert reranked[3].late_score is None and reranked[3].score == pytest.approx(0.2 * (1 / 3) / 0.4)
    details = reranked[0].as_dict()
    assert details["late_interaction_score"] == 0.9 and details["first_pass_score"] == 0.6
    # A candidate the late leg did not score adds 0 there and keeps its other legs.
    partial = late_interaction_rerank(first[:2], {"b": 0.5}, depth=2)
    assert [(r.chunk_id, r.late_score, r.late_norm) for r in partial] == [("a", None, 0.0), ("b", 0.5, 1.0)]
    assert [r.score for r in partial] == pytest.approx([2 / 3, (0 + 0.5 + 1) / 3])


def test_rerank_rescores_the_fused_candidates_with_maxsim(ingested: RagService) -> None:
    plain = _hybrid(ingested, {})
    result = _hybrid(ingested, {"rerank": "colbert"})
    specific = result["metadata"]["technique_specific"]
    assert specific["rerank"] == "colbert" and specific["rerank_applied"] is True
    candidates = len(set(plain["metadata"]["technique_specific"]["used_chunk_ids"]))
    assert specific["reranked_candidates"] >= candidates
    documents = result["retrieved_documents"]
    assert documents[0]["id"] == "aspirin"
    # Five chunks, all in the re-ranked head: each leg is scaled over the same candidates as the first
    # pass, so the new score is the mean of the first pass's two norms and the MaxSim norm.
    for document in documents:
        details = document["score_details"]
        expected = (details["dense_norm"] + details["keyword_norm"] + details["late_interaction_norm"]) / 3
        assert details["fused_score"] == pytest.approx(expected, abs=1e-5)
        assert document["similarity_score"] == pytest.approx(details["fused_score"], abs=1e-5)
        assert details["first_pass_score"] == pytest.approx(
            0.5 * details["dense_norm"] + 0.5 * details["keyword_norm"], abs=1e-5
        )
    scores = [d["similarity_score"] for d in documents]
    assert scores == sorted(scores, reverse=True)
    # The MaxSim is the colbert index's own (every stored token, no threshold) over the query's tokens.
    pipeline = ingested.pipelines["hybrid_ifind"]
    assert isinstance(pipeline, HybridIFindPipeline)
    late = pipeline._late()
    assert late.index is not None
    encoding = late.encode_query(QUERY).result()
    chunk_ids = [d["chunk_id"] for d in documents]
    stored = late.index.load("docs", chunk_ids)
    reference = batch_maxsim(encoding.tokens.vectors, [stored[c].vectors() for c in chunk_ids], 0.0)
    reference /= encoding.tokens.vectors.shape[0]
    measured = [d["score_details"]["late_interaction_score"] for d in documents]
    np.testing.assert_allclose(measured, reference, atol=1e-5)
    # The dense leg's vector came from the same pass: the same as a plain encode of the query.
    assert encoding.dense is not None
    np.testing.assert_allclose(encoding.dense, ingested.embedder.encode_query(QUERY), atol=1e-6)


def test_rerank_changes_the_ranking_where_maxsim_disagrees(ingested: RagService) -> None:
    """A weak MaxSim leader loses its place: the order follows the three legs, not the fusion alone."""
    query = "lava yeast"
    plain = [d["chunk_id"] for d in _hybrid(ingested, {}, query)["retrieved_documents"]]
    result = _hybrid(ingested, {"rerank": "colbert"}, query)
    reranked = [d["chunk_id"] for d in result["retrieved_documents"]]
    assert sorted(plain) == sorted(reranked)
    assert plain != reranked, "the query was chosen for a MaxSim that reorders the fused top"


def _served(tmp_path: Path, embedder: Embedder, **values: Any) -> RagService:
    return RagService(Settings(RAG_DATA_DIR=tmp_path / "data", **values), embedder=embedder)


def test_without_a_token_index_the_fusion_ranks_and_says_why(tmp_path: Path, embedder: Embedder) -> None:
    service = _served(tmp_path, embedder, RAG_TECHNIQUES="basic,hybrid_ifind")
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
        plain = _hybrid(service, {})
        result = _hybrid(service, {"rerank": "colbert"})
    finally:
        service.close()
    specific = result["metadata"]["technique_specific"]
    assert specific["rerank_applied"] is False
    assert "covers 0 of 5 documents" in specific["rerank_skipped"]
    assert "RAG_TECHNIQUES" in specific["rerank_skipped"]
    assert "ranked by the fusion alone" in specific["rerank_skipped"]
    assert [d["chunk_id"] for d in result["retrieved_documents"]] == [
        d["chunk_id"] for d in plain["retrieved_documents"]
    ]
    assert "late_interaction_score" not in result["retrieved_documents"][0]["score_details"]


@pytest.fixture
def building(tmp_path: Path, embedder: Embedder) -> Iterator[tuple[RagService, threading.Event]]:
    """INDEX_BUILD=background with the builder held before its first job: the token index is empty."""
    service = _served(tmp_path, embedder, INDEX_BUILD="background", RAG_TECHNIQUES="hybrid_ifind,colbert")
    builder = service.index_builder
    assert isinstance(builder, IndexBuilder)
    release = threading.Event()
    build = builder.build

    def held(job: Job) -> None:
        release.wait(60)
        build(job)

    builder.build = held  # type: ignore[method-assign]
    yield service, release
    release.set()
    service.close()


def test_while_the_token_index_builds_the_fusion_ranks_and_says_so(
    building: tuple[RagService, threading.Event],
) -> None:
    service, release = building
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    result = _hybrid(service, {"rerank": "colbert"})
    specific = result["metadata"]["technique_specific"]
    assert specific["rerank_applied"] is False
    assert specific["rerank_skipped"].startswith("the ColBERT token index is still being built (0 of 5")
    assert result["retrieved_documents"][0]["id"] == "aspirin"
    release.set()
    service.wait_for_indexes("docs", quiet=True)
    after = _hybrid(service, {"rerank": "colbert"})["metadata"]["technique_specific"]
    assert after["rerank_applied"] is True


def test_bad_rerank_value_is_refused(ingested: RagService) -> None:
    with pytest.raises(InvalidParametersError, match="rerank"):
        _hybrid(ingested, {"rerank": "cross-encoder"})


def test_the_shared_pass_gives_the_dense_vector_and_is_remembered(embedder: Embedder) -> None:
    assert embedder.backend == "onnx", "scripts/setup.sh exports the model: the suite runs on ONNX"
    query = "Which proteins does the shared pass see?"
    pending = embedder.encode_query_states_async(query)
    assert pending is not None
    states = pending.result()
    assert states.states.shape == (states.token_ids.shape[0], embedder.dimension)
    assert states.token_ids[0] == embedder.tokenizer.cls_token_id
    # A later encode of the same query (the answer's relevance check) is the remembered vector.
    later = embedder.encode_query_async(query)
    assert later.done()
    assert np.array_equal(later.result(), states.vector)
    np.testing.assert_allclose(states.vector, embedder.encode([query])[0], atol=1e-6)


def test_rerank_on_postgres_reads_the_same_token_vectors(
    ingested: RagService, postgres_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    service = _served(
        tmp_path / "pg",
        embedder,
        RAG_STORE="postgres",
        RAG_POSTGRES_URL=postgres_url,
        RAG_TECHNIQUES="hybrid_ifind,colbert",
    )
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
        result = _hybrid(service, {"rerank": "colbert"})
    finally:
        service.close()
    assert result["metadata"]["technique_specific"]["rerank_applied"] is True
    on_sqlite = {
        d["chunk_id"]: d["score_details"]["late_interaction_score"]
        for d in _hybrid(ingested, {"rerank": "colbert"})["retrieved_documents"]
    }
    on_postgres = {
        d["chunk_id"]: d["score_details"]["late_interaction_score"] for d in result["retrieved_documents"]
    }
    assert on_postgres.keys() == on_sqlite.keys()
    for chunk_id, score in on_postgres.items():
        assert score == pytest.approx(on_sqlite[chunk_id], abs=1e-5)


def test_a_store_without_token_storage_ranks_by_the_fusion_and_says_so(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that has no rag_colbert storage (the SQLite registry without it, as an IRIS store)."""
    from iris_rag.backends import sqlite
    from iris_rag.techniques.colbert.storage import TokenVectorStorage

    lacking = {k: v for k, v in sqlite.TECHNIQUE_STORAGE.items() if k is not TokenVectorStorage}
    monkeypatch.setattr(sqlite, "TECHNIQUE_STORAGE", lacking)
    service = _served(tmp_path, embedder, RAG_TECHNIQUES="basic,hybrid_ifind")
    try:
        service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
        result = _hybrid(service, {"rerank": "colbert"})
    finally:
        service.close()
    specific = result["metadata"]["technique_specific"]
    assert specific["rerank_applied"] is False
    assert specific["rerank_skipped"].startswith("this store keeps no ColBERT token vectors (the sqlite")
    assert result["retrieved_documents"][0]["id"] == "aspirin"

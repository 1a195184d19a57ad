"""rag_colbert on a real store and model: MaxSim, every parameter, filters, generate=false, reindex."""

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.embedder import Embedder
from iris_rag.errors import IndexNotBuiltError
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.colbert.pipeline import batch_maxsim, maxsim
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from tests.conftest import DOCUMENTS, SAMPLE_CORPUS


def colbert(
    service: RagService, query: str, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    arguments: dict[str, Any] = {"query": query, "collection_id": "docs", "technique_params": params or {}}
    if options:
        arguments["options"] = options
    return service.execute({"technique": "colbert", "arguments": arguments})


def ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


@pytest.fixture
def colbert_service(loaded_service: RagService) -> RagService:
    return loaded_service


@pytest.fixture
def sample_service(service: RagService) -> RagService:
    """40 SciFact abstracts (about 90 chunks): enough candidates for the pool to matter."""
    lines = SAMPLE_CORPUS.read_text(encoding="utf-8").splitlines()[:40]
    documents = [
        {"id": str(r["_id"]), "title": r.get("title", ""), "content": r["text"]}
        for r in (json.loads(line) for line in lines)
    ]
    assert service.ingest({"collection_id": "docs", "documents": documents})["ingested_count"] == 40
    return service


def test_maxsim_matches_a_hand_computation() -> None:
    query = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    document = np.array([[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]], dtype=np.float32)
    # Similarities: q0 → (0.6, 1.0, 0.0), q1 → (0.8, 0.0, -1.0), q2 → (1.0, 0.6, -0.8).
    result = maxsim(query, document)
    assert result.score == pytest.approx(1.0 + 0.8 + 1.0)
    assert result.best_index.tolist() == [1, 0, 0]
    assert result.best.tolist() == pytest.approx([1.0, 0.8, 1.0])
    strict = maxsim(query, document, threshold=0.9)
    assert strict.score == pytest.approx(2.0) and strict.matched.tolist() == [True, False, True]
    weighted = maxsim(query, document, weights=np.array([1.0, 0.5, 0.0], dtype=np.float32))
    assert weighted.score == pytest.approx(1.0 + 0.4)
    other = np.array([[0.0, 1.0]], dtype=np.float32)
    empty = np.zeros((0, 2), dtype=np.float32)
    batch = batch_maxsim(query, [document, empty, other], threshold=0.5)
    assert batch.tolist() == pytest.approx([2.8, 0.0, 1.0 + 0.8])  # q0 → 0.0 (< 0.5), q1 → 1.0, q2 → 0.8
    assert maxsim(query, empty).score == 0.0


def test_results_report_interaction_and_matched_tokens(colbert_service: RagService) -> None:
    result = colbert(colbert_service, "does aspirin prevent heart attacks?", top_k=3)
    assert ids(result)[0] == "aspirin"
    top = result["retrieved_documents"][0]
    details = top["score_details"]
    assert {"as", "##pi", "##rin", "heart"} <= set(details["matched_query_tokens"])
    match = next(m for m in details["token_matches"] if m["query_token"] == "heart")
    assert match["document_token"] == "heart" and match["similarity"] >= 0.5
    specific = result["metadata"]["technique_specific"]
    query_tokens = specific["query_tokens"]
    assert query_tokens[:2] == ["does", "as"] and "?" not in query_tokens
    assert details["interaction_normalized"] == pytest.approx(
        details["interaction_score"] / len(query_tokens), abs=1e-5
    )
    assert details["fused_score"] == pytest.approx(
        0.5 * details["dense_score"] + 0.5 * details["interaction_normalized"], abs=1e-5
    )
    assert top["similarity_score"] == pytest.approx(details["fused_score"], abs=1e-5)
    assert specific["used_chunk_ids"] == [d["chunk_id"] for d in result["retrieved_documents"]]


def test_dense_weight_moves_between_the_two_scores(colbert_service: RagService) -> None:
    query = "bread that rises with wild yeast"
    dense = colbert(colbert_service, query, {"dense_weight": 1.0}, top_k=3)
    basic = colbert_service.execute(
        {
            "technique": "basic",
            "arguments": {"query": query, "collection_id": "docs", "options": {"top_k": 3}},
        }
    )
    assert ids(dense) == ids(basic)
    for mine, theirs in zip(dense["retrieved_documents"], basic["retrieved_documents"], strict=True):
        assert mine["similarity_score"] == pytest.approx(theirs["similarity_score"], abs=1e-5)
    late = colbert(colbert_service, query, {"dense_weight": 0.0}, top_k=3)
    for document in late["retrieved_documents"]:
        assert document["similarity_score"] == pytest.approx(
            document["score_details"]["interaction_normalized"], abs=1e-5
        )


def test_interaction_threshold_drops_weak_matches(colbert_service: RagService) -> None:
    query = "aspirin and the risk of stomach bleeding"
    loose = colbert(colbert_service, query, {"interaction_threshold": 0.0}, top_k=3)
    strict = colbert(colbert_service, query, {"interaction_threshold": 0.8}, top_k=3)
    count = len(loose["metadata"]["technique_specific"]["query_tokens"])
    by_id = {d["id"]: d["score_details"] for d in strict["retrieved_documents"]}
    for document in loose["retrieved_documents"]:
        weak, high = document["score_details"], by_id[document["id"]]
        assert len(weak["matched_query_tokens"]) == count, "threshold 0: every best match counts"
        assert len(high["matched_query_tokens"]) < count
        assert all(m["similarity"] >= 0.8 for m in high["token_matches"])
        assert high["interaction_score"] < weak["interaction_score"]
    assert {"##rin", "bleeding"} <= set(by_id["aspirin"]["matched_query_tokens"])


def test_compression_ratio_changes_the_tokens_used(colbert_service: RagService) -> None:
    query = "aspirin heart attack risk"
    full = colbert(colbert_service, query, {"compression_ratio": 1.0}, top_k=3)
    small = colbert(colbert_service, query, {"compression_ratio": 0.1}, top_k=3)
    full_details = {d["id"]: d["score_details"] for d in full["retrieved_documents"]}
    for document in small["retrieved_documents"]:
        details = document["score_details"]
        stored = details["tokens_stored"]
        assert full_details[document["id"]]["tokens_used"] == stored
        assert details["tokens_used"] == math.ceil(0.1 * stored) < stored
    assert (
        small["metadata"]["technique_specific"]["tokens_scored"]
        < full["metadata"]["technique_specific"]["tokens_scored"]
        == full["metadata"]["technique_specific"]["tokens_stored"]
    )
    # The tokens kept are the collection's rarest: 'aspirin' pieces occur in one chunk, 'the' in several.
    kept = {m["document_token"] for m in small["retrieved_documents"][0]["score_details"]["token_matches"]}
    assert "the" not in kept
    assert full["retrieved_documents"][0]["score_details"]["interaction_score"] != pytest.approx(
        small["retrieved_documents"][0]["score_details"]["interaction_score"]
    )


def test_max_query_length_truncates_the_query(colbert_service: RagService) -> None:
    query = " ".join(["aspirin"] * 20 + ["volcano lava eruption"] * 10)  # about 55 word pieces
    short = colbert(colbert_service, query, {"max_query_length": 32}, top_k=1)
    long = colbert(colbert_service, query, {"max_query_length": 256}, top_k=1)
    short_specific = short["metadata"]["technique_specific"]
    long_specific = long["metadata"]["technique_specific"]
    assert short_specific["query_token_count"] == 30 and short_specific["query_truncated"]
    assert "lava" not in short_specific["query_tokens"]
    assert long_specific["query_token_count"] > 30 and not long_specific["query_truncated"]
    assert "lava" in long_specific["query_tokens"]
    short_score = short["retrieved_documents"][0]["score_details"]["interaction_score"]
    assert short_score != pytest.approx(long["retrieved_documents"][0]["score_details"]["interaction_score"])


def test_query_expansion_adds_tokens(sample_service: RagService) -> None:
    query = "vitamin D deficiency"
    plain = colbert(sample_service, query, top_k=5)
    expanded = colbert(sample_service, query, {"enable_query_expansion": True}, top_k=5)
    assert plain["metadata"]["technique_specific"]["expansion_tokens"] == []
    specific = expanded["metadata"]["technique_specific"]
    added = specific["expansion_tokens"]
    assert len(added) == 10 and not set(added) & set(specific["query_tokens"])
    matches = [m for d in expanded["retrieved_documents"] for m in d["score_details"]["token_matches"]]
    assert any(m.get("expansion") and m["query_token"] in added for m in matches)
    before = {d["chunk_id"]: d["similarity_score"] for d in plain["retrieved_documents"]}
    after = {d["chunk_id"]: d["similarity_score"] for d in expanded["retrieved_documents"]}
    assert before != after


def test_candidate_pool_bounds_the_rescored_chunks(sample_service: RagService) -> None:
    query = "gene expression in cancer cells"
    chunks = sample_service.store.chunk_count("docs")
    assert chunks > 60
    small = colbert(sample_service, query, {"candidate_pool": 10}, top_k=10)
    large = colbert(sample_service, query, {"candidate_pool": 60}, top_k=10)
    assert small["metadata"]["technique_specific"]["candidates"] == 10
    assert large["metadata"]["technique_specific"]["candidates"] == 60
    # With 10 candidates the results are exactly the dense top 10, re-ordered.
    dense = sample_service.execute(
        {
            "technique": "basic",
            "arguments": {"query": query, "collection_id": "docs", "options": {"top_k": 10}},
        }
    )
    chunk_ids = {d["chunk_id"] for d in dense["retrieved_documents"]}
    assert {d["chunk_id"] for d in small["retrieved_documents"]} == chunk_ids
    assert {d["chunk_id"] for d in large["retrieved_documents"]} != chunk_ids
    # top_k above the pool widens it.
    wide = colbert(sample_service, query, {"candidate_pool": 10}, top_k=20)
    assert wide["metadata"]["technique_specific"]["candidates"] == 20


def test_filters_apply_to_the_candidates(colbert_service: RagService) -> None:
    query = "aspirin volcano bread"
    result = colbert(colbert_service, query, top_k=5, filters={"year": {"gte": 2020}})
    assert set(ids(result)) == {"volcano", "sourdough"}
    assert result["metadata"]["filters"]["matched_documents"] == 2
    assert ids(colbert(colbert_service, query, top_k=5, filters={"topic": "cardiology"})) == ["aspirin"]
    unknown = colbert(colbert_service, query, filters={"colour": "red"})
    assert unknown["retrieved_documents"] == []
    assert unknown["metadata"]["filters"]["unknown_fields"] == ["colour"]


def test_generate_false_returns_evidence_only(colbert_service: RagService) -> None:
    result = colbert(colbert_service, "what makes sourdough sour?", generate=False, top_k=2)
    assert result["answer"] is None and result["metadata"]["answer_source"] == "none"
    assert ids(result)[0] == "sourdough"
    answered = colbert(colbert_service, "what makes sourdough sour?", top_k=2)
    assert answered["answer"] and "[1]" in answered["answer"]


def test_index_not_built_until_reindex(settings: Settings, embedder: Embedder) -> None:
    # The collection is ingested by a store that has no token index (as before rag_colbert existed).
    store = SqliteStore(settings.database_path)
    Ingestor(settings, store, embedder).ingest(
        "docs", [SourceDocument(str(d["id"]), str(d["content"]), str(d["title"])) for d in DOCUMENTS]
    )
    store.close()
    service = RagService(settings, embedder=embedder)
    try:
        with pytest.raises(IndexNotBuiltError) as raised:
            colbert(service, "aspirin")
        assert raised.value.code == "INDEX_NOT_BUILT"
        assert raised.value.details == {"indexed": 0, "documents": 3}
        assert "colbert" in service.stale_indexes("docs")
        service.reindex("docs")
        assert ids(colbert(service, "aspirin heart attack", top_k=1)) == ["aspirin"]
    finally:
        service.close()


@pytest.fixture
def postgres_service(postgres_url: str, tmp_path: Path, embedder: Embedder) -> Iterator[RagService]:
    """rag_colbert on RAG_STORE=postgres (a fresh database), holding the three DOCUMENTS."""
    settings = Settings(
        RAG_STORE="postgres",
        RAG_POSTGRES_URL=postgres_url,
        RAG_DATA_DIR=tmp_path / "postgres",
        RAG_TECHNIQUES="colbert",
    )
    service = RagService(settings, embedder=embedder)
    try:
        assert service.ingest({"collection_id": "docs", "documents": DOCUMENTS})["ingested_count"] == 3
        yield service
    finally:
        service.close()


def test_postgres_answers_as_sqlite_does_and_its_rows_follow_their_documents(
    colbert_service: RagService, postgres_service: RagService
) -> None:
    """The same rows on both backends: same ranking, scores and matches; deletes and replaces on Postgres."""
    query = "does aspirin prevent heart attacks?"
    on_sqlite, on_postgres = (
        colbert(colbert_service, query, top_k=3),
        colbert(postgres_service, query, top_k=3),
    )
    assert ids(on_postgres) == ids(on_sqlite) and ids(on_postgres)[0] == "aspirin"
    for mine, theirs in zip(
        on_postgres["retrieved_documents"], on_sqlite["retrieved_documents"], strict=True
    ):
        assert mine["similarity_score"] == pytest.approx(theirs["similarity_score"], abs=1e-5)
        assert (
            mine["score_details"]["matched_query_tokens"] == theirs["score_details"]["matched_query_tokens"]
        )
    assert on_postgres["answer"] and "[1]" in on_postgres["answer"]

    rows = postgres_service.store.technique_storage(TokenVectorStorage)
    sqlite_rows = colbert_service.store.technique_storage(TokenVectorStorage)
    assert rows.frequencies("docs") == sqlite_rows.frequencies("docs")
    for service in (colbert_service, postgres_service):
        assert service.store.delete_document("docs", "sourdough")
    assert rows.document_token_ids("docs", "sourdough") == []
    assert rows.indexed_documents("docs") == 2
    assert rows.frequencies("docs") == sqlite_rows.frequencies("docs"), "the deleted rows left the counts"
    assert "sourdough" not in ids(colbert(postgres_service, "what makes sourdough bread rise?", top_k=3))

    replaced = {"id": "volcano", "title": "Sourdough", "content": "Wild yeast makes sourdough bread rise."}
    postgres_service.ingest({"collection_id": "docs", "documents": [replaced]})
    assert rows.indexed_documents("docs") == 2 and rows.totals().documents == 2
    assert ids(colbert(postgres_service, "what makes sourdough bread rise?", top_k=1)) == ["volcano"]

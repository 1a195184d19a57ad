"""4R ranking (options.ranking): the four scores, and reordering through the real service and pipelines."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError
from iris_rag.pipeline import QueryOptions
from iris_rag.ranking import (
    RankingOptions,
    parse_date,
    recency_score,
    rerank,
    richness_score,
    source_reputation,
)
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import StoredChunk
from iris_rag.techniques.registry import PIPELINES

NOW = datetime.now(UTC)
QUERY = "Does daily low-dose aspirin prevent heart attacks in older adults?"


def _day(days_ago: int) -> str:
    return (NOW - timedelta(days=days_ago)).date().isoformat()


# The trial answers the query best but is old and from a source the table rates low; the guidance note is
# less on point, recent, often cited and from a highly rated source. Two unrelated documents are undated.
DOCUMENTS: list[dict[str, Any]] = [
    {
        "id": "trial",
        "title": "Aspirin trial",
        "content": "Daily low-dose aspirin prevented first heart attacks in older adults in a large "
        "randomized trial.",
        "metadata": {"published": _day(20 * 365), "citations": 12, "source": "https://old.example/trial"},
    },
    {
        "id": "guidance",
        "title": "Cardiology guidance",
        "content": "Updated cardiology guidance mentions aspirin briefly among other drugs for the heart.",
        "metadata": {"published": _day(30), "citations": 480, "source": "https://guidelines.example/2025"},
    },
    {
        "id": "volcano",
        "title": "Volcanic eruptions",
        "content": "Basaltic volcanoes erupt runny lava that flows for kilometres.",
    },
    {
        "id": "sourdough",
        "title": "Baking sourdough",
        "content": "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the dough.",
    },
]


@pytest.fixture(scope="module")
def ranked_service(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Iterator[RagService]:
    """One service for the module, its collection 'ranked' holding DOCUMENTS (every technique indexed)."""
    settings = Settings(RAG_DATA_DIR=tmp_path_factory.mktemp("ranking") / "data")
    service = RagService(settings, embedder=embedder)
    assert service.ingest({"collection_id": "ranked", "documents": DOCUMENTS})["ingested_count"] == 4
    yield service
    service.close()


def _ask(service: RagService, technique: str = "basic", **options: Any) -> dict[str, Any]:
    arguments = {"query": QUERY, "collection_id": "ranked", "options": {"generate": False, **options}}
    return service.execute({"technique": technique, "arguments": arguments})


def _ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


# Through the service: recency and reputation change the order
def test_off_by_default_the_technique_order_and_no_ranking_details(ranked_service: RagService) -> None:
    result = _ask(ranked_service, top_k=2)
    assert _ids(result) == ["trial", "guidance"]
    assert all("ranking" not in d.get("score_details", {}) for d in result["retrieved_documents"])


def test_recency_moves_the_recent_document_first_from_beyond_top_k(ranked_service: RagService) -> None:
    # top_k 1: the guidance note is only reachable because ranking reranks a wider pool than top_k.
    assert _ids(_ask(ranked_service, top_k=1)) == ["trial"]
    ranking = {"relevancy": 0.3, "recency": 0.7, "date_field": "published", "half_life_days": 365}
    result = _ask(ranked_service, top_k=1, ranking=ranking)
    assert _ids(result) == ["guidance"]
    details = result["retrieved_documents"][0]["score_details"]["ranking"]
    assert set(details) == {"relevancy", "recency", "richness", "reputation", "overall", "technique_rank"}
    assert details["technique_rank"] == 2
    assert details["recency"] == pytest.approx(0.5 ** (30 / 365), abs=0.01)
    assert details["overall"] == pytest.approx(
        0.3 * details["relevancy"] + 0.7 * details["recency"], abs=1e-5
    )


def test_a_long_half_life_keeps_relevance_first(ranked_service: RagService) -> None:
    ranking = {"relevancy": 0.5, "recency": 0.5, "date_field": "published", "half_life_days": 36500}
    assert _ids(_ask(ranked_service, top_k=2, ranking=ranking)) == ["trial", "guidance"]


def test_reputation_from_a_metadata_field_changes_the_order(ranked_service: RagService) -> None:
    ranking = {"relevancy": 0.3, "reputation": 0.7, "reputation_field": "citations"}
    result = _ask(ranked_service, top_k=2, ranking=ranking)
    assert _ids(result) == ["guidance", "trial"]
    scores = {d["id"]: d["score_details"]["ranking"]["reputation"] for d in result["retrieved_documents"]}
    assert scores == {"guidance": 1.0, "trial": pytest.approx(12 / 480, abs=1e-6)}


def test_reputation_from_a_source_table_changes_the_order(ranked_service: RagService) -> None:
    table = {"https://guidelines.example/": 0.9, "https://old.example/": 0.1, "*": 0.5}
    ranking = {"relevancy": 0.3, "reputation": 0.7, "reputation_sources": table}
    result = _ask(ranked_service, top_k=4, ranking=ranking)
    assert _ids(result)[0] == "guidance"
    scores = {d["id"]: d["score_details"]["ranking"]["reputation"] for d in result["retrieved_documents"]}
    assert scores == {"guidance": 0.9, "trial": 0.1, "volcano": 0.5, "sourdough": 0.5}


def test_default_weights_keep_the_technique_order(ranked_service: RagService) -> None:
    plain, ranked = _ask(ranked_service, top_k=4), _ask(ranked_service, top_k=4, ranking={})
    assert _ids(ranked) == _ids(plain)
    for rank, document in enumerate(ranked["retrieved_documents"], start=1):
        details = document["score_details"]["ranking"]
        assert details["technique_rank"] == rank
        assert details["overall"] == details["relevancy"]
    assert ranked["retrieved_documents"][0]["score_details"]["ranking"]["relevancy"] == 1.0
    assert ranked["retrieved_documents"][-1]["score_details"]["ranking"]["relevancy"] == 0.0


def test_metadata_reorders_alike_on_every_store(any_service: RagService) -> None:
    """Dates and counts read back from SQLite's JSON and PostgreSQL's JSONB score the same."""
    any_service.ingest({"collection_id": "ranked", "documents": DOCUMENTS})
    recency = {"relevancy": 0.3, "recency": 0.7, "date_field": "published"}
    reputation = {"relevancy": 0.3, "reputation": 0.7, "reputation_field": "citations"}
    assert _ids(_ask(any_service, top_k=1)) == ["trial"]
    assert _ids(_ask(any_service, top_k=1, ranking=recency)) == ["guidance"]
    result = _ask(any_service, top_k=2, ranking=reputation)
    assert _ids(result) == ["guidance", "trial"]
    assert result["retrieved_documents"][1]["score_details"]["ranking"]["reputation"] == 0.025


@pytest.mark.parametrize("technique", sorted(PIPELINES))
def test_every_technique_accepts_ranking(ranked_service: RagService, technique: str) -> None:
    ranking = {"relevancy": 0.3, "recency": 0.7, "date_field": "published"}
    result = _ask(ranked_service, technique, top_k=3, ranking=ranking)
    documents = result["retrieved_documents"]
    assert 1 <= len(documents) <= 3
    overall = [d["score_details"]["ranking"]["overall"] for d in documents]
    assert overall == sorted(overall, reverse=True)
    # Every technique puts the trial first on its own (test_off_by_default... for basic); recency turns it.
    assert _ids(result)[:2] == ["guidance", "trial"]


@pytest.mark.parametrize(
    ("ranking", "message"),
    [
        ({"relevancy": 0}, "every weight is 0"),
        ({"reputation": 1}, "reputation_field"),
        ({"reputation": 1, "reputation_field": "c", "reputation_sources": {"a": 1}}, "exactly one"),
    ],
)
def test_rankings_that_cannot_rank_are_invalid_parameters(
    ranked_service: RagService, ranking: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidParametersError, match=message):
        _ask(ranked_service, ranking=ranking)


@pytest.mark.parametrize(
    "ranking",
    [
        {"recency": -1},
        {"weights": {"recency": 1}},
        {"half_life_days": 0},
        {"candidates": 500},
        {"reputation_sources": {"a": 2}},
        {"date_field": "bad field"},
    ],
)
def test_malformed_rankings_are_invalid_parameters(
    ranked_service: RagService, ranking: dict[str, Any]
) -> None:
    with pytest.raises(InvalidParametersError, match="ranking"):
        _ask(ranked_service, ranking=ranking)


def test_ranking_options_match_the_schema() -> None:
    spec = tool_spec("rag_basic")
    assert spec is not None
    schema = spec["inputSchema"]["properties"]["options"]["properties"]["ranking"]["properties"]
    assert set(schema) == set(RankingOptions.model_fields)
    for name, field in RankingOptions.model_fields.items():
        assert schema[name].get("default") == field.default, name


# The four scores
def test_dates_in_the_forms_metadata_holds_them() -> None:
    assert parse_date("2024-05-01") == datetime(2024, 5, 1, tzinfo=UTC)
    assert parse_date("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert parse_date("2024-05-01T12:00:00") == datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert parse_date(2019) == parse_date("2019") == datetime(2019, 1, 1, tzinfo=UTC)
    assert parse_date("2019-07") == datetime(2019, 7, 1, tzinfo=UTC)
    for unreadable in (None, True, "yesterday", "2019-13", 0, 12345, [2019]):
        assert parse_date(unreadable) is None, unreadable


def test_recency_halves_every_half_life() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert recency_score(now, now, 30) == 1.0
    assert recency_score(now + timedelta(days=9), now, 30) == 1.0  # a future date is as recent as today
    assert recency_score(now - timedelta(days=30), now, 30) == pytest.approx(0.5)
    assert recency_score(now - timedelta(days=90), now, 30) == pytest.approx(0.125)
    assert recency_score(None, now, 30) == 0.0


def test_richness_grows_with_distinct_content_words() -> None:
    thin = richness_score("It is what it is, and it was what it was.")
    repeated = richness_score("aspirin aspirin aspirin aspirin aspirin")
    snippet = richness_score("Aspirin lowers heart-attack risk.")
    paragraph = richness_score(DOCUMENTS[0]["content"] + " " + DOCUMENTS[1]["content"])
    assert thin == 0.0
    assert repeated == pytest.approx(1 / 26)
    assert 0 < snippet < paragraph < 1


def test_source_reputation_takes_the_longest_matching_prefix() -> None:
    table = {"https://a.example/": 0.4, "https://a.example/journal/": 0.9, "*": 0.2}
    assert source_reputation("https://a.example/journal/x", table) == 0.9
    assert source_reputation("https://a.example/blog/x", table) == 0.4
    assert source_reputation("https://b.example/", table) == 0.2
    assert source_reputation(None, table) == 0.2
    assert source_reputation("https://b.example/", {"https://a.example/": 1.0}) == 0.0


class _Doc:
    def __init__(self, name: str, score: float, **metadata: Any) -> None:
        self.chunk = StoredChunk(f"{name}#0", name, 0, f"{name} text", 0, 1, name, metadata)
        self.score = score
        self.details: dict[str, Any] = {"kept": True}


def test_rerank_combines_normalized_weights_and_keeps_ties_in_order() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    docs = [_Doc("a", 0.9, year=2000), _Doc("b", 0.5, year=2026), _Doc("c", 0.5, year=2026)]
    # Weights 1 and 3 are 0.25 and 0.75: a = 0.25 * 1 + 0.75 * ~0; b and c = 0.25 * 0 + 0.75 * 1, tied.
    ranked = rerank(docs, RankingOptions(relevancy=1, recency=3, date_field="year"), now)
    assert [d.chunk.document_id for d in ranked] == ["b", "c", "a"]
    assert ranked[0].details["ranking"]["overall"] == pytest.approx(0.75)
    assert ranked[2].details["ranking"]["overall"] == pytest.approx(0.25)
    assert ranked[0].details["kept"] is True
    assert rerank([], RankingOptions()) == []


def test_the_pool_is_candidates_never_below_top_k() -> None:
    assert QueryOptions(top_k=5).for_retrieval().top_k == 5
    assert QueryOptions(top_k=5, ranking=RankingOptions()).for_retrieval().top_k == 50
    assert QueryOptions(top_k=40, ranking=RankingOptions(candidates=10)).for_retrieval().top_k == 40

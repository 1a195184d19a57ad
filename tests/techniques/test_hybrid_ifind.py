"""rag_hybrid_ifind on a real store and model: both legs, fusion choices, fuzzy terms, boosts, filters."""

from typing import Any

import pytest

from iris_rag.backends.sqlite.store import match_expression
from iris_rag.errors import InvalidParametersError
from iris_rag.retrieval.keyword import repair_terms
from iris_rag.service import RagService
from iris_rag.stores.base import KeywordQuery, ScoredChunk
from iris_rag.text import query_terms
from tests.conftest import DOCUMENTS

EXTRA = [
    {
        "id": "insulin",
        "title": "Insulin therapy",
        "content": "Patients with type 2 diabetes often need insulin when oral drugs fail. "
        "Glucose monitoring guides the dose.",
        "metadata": {"year": 2022, "topic": "endocrinology", "journal": "Diabetes Care"},
    },
    {
        "id": "xk-417",
        "title": "Compound XK-417",
        "content": "The inhibitor XK-417 blocked kinase activity in cultured cells.",
        "metadata": {"year": 2018, "topic": "pharmacology", "date": "2018-05-04"},
    },
]


@pytest.fixture
def hybrid_service(service: RagService) -> RagService:
    result = service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    assert result["ingested_count"] == 5
    return service


def hybrid(
    service: RagService, query: str, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    arguments: dict[str, Any] = {"query": query, "collection_id": "docs", "technique_params": params or {}}
    if options:
        arguments["options"] = options
    return service.execute({"technique": "hybrid_ifind", "arguments": arguments})


def ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


def test_query_terms_are_quoted_and_safe() -> None:
    assert query_terms('What is "XK-417" AND (NOT) the*?') == ["xk", "417", "not"]
    assert match_expression(KeywordQuery.of(["xk", 'a"b'])) == '"xk" OR "ab"'


def test_score_breakdown_and_used_chunks(hybrid_service: RagService) -> None:
    result = hybrid(hybrid_service, "XK-417 kinase inhibitor", {"vector_weight": 0.5, "keyword_weight": 0.5})
    top = result["retrieved_documents"][0]
    assert top["id"] == "xk-417"
    details = top["score_details"]
    assert set(details) == {
        "dense_score",
        "keyword_score",
        "dense_norm",
        "keyword_norm",
        "fused_score",
        "dense_rank",
        "keyword_rank",
    }
    assert details["keyword_rank"] == 1 and details["keyword_norm"] == 1.0
    assert details["fused_score"] == pytest.approx(
        0.5 * details["dense_norm"] + 0.5 * details["keyword_norm"]
    )
    assert top["similarity_score"] == pytest.approx(details["fused_score"])
    specific = result["metadata"]["technique_specific"]
    assert specific["used_chunk_ids"] == [d["chunk_id"] for d in result["retrieved_documents"]]
    assert specific["keyword_terms"] == ["xk", "417", "kinase", "inhibitor"]


def test_weights_and_fusion_method_change_the_ranking(hybrid_service: RagService) -> None:
    # "lava" appears only in the volcano text; the meaning of the query points at baking.
    query = "bread dough lava"
    keyword_only = hybrid(hybrid_service, query, {"vector_weight": 0.0, "keyword_weight": 1.0}, top_k=5)
    dense_only = hybrid(hybrid_service, query, {"vector_weight": 1.0, "keyword_weight": 0.0}, top_k=5)
    assert ids(keyword_only) != ids(dense_only)
    keyword_docs = {
        d["id"] for d in keyword_only["retrieved_documents"] if d["score_details"]["keyword_rank"]
    }
    assert {"volcano", "sourdough"} <= keyword_docs
    rrf = hybrid(hybrid_service, query, {"fusion_method": "rrf", "rrf_k": 1}, top_k=5)
    assert rrf["metadata"]["technique_specific"]["rrf_k"] == 1
    top = rrf["retrieved_documents"][0]["score_details"]
    expected = (0.5 / (1 + top["dense_rank"]) if top["dense_rank"] else 0) + (
        0.5 / (1 + top["keyword_rank"]) if top["keyword_rank"] else 0
    )
    assert top["fused_score"] == pytest.approx(expected)


def test_a_technique_parameter_error_reads_as_a_sentence(hybrid_service: RagService) -> None:
    with pytest.raises(InvalidParametersError) as both_zero:
        hybrid(hybrid_service, "bread", {"vector_weight": 0, "keyword_weight": 0})
    assert both_zero.value.message == (
        "invalid technique_params for hybrid_ifind: vector_weight and keyword_weight cannot both be 0"
    )
    assert both_zero.value.details["errors"] == ["vector_weight and keyword_weight cannot both be 0"]


def test_fuzzy_matching_repairs_misspellings_without_flooding(hybrid_service: RagService) -> None:
    plain = hybrid(hybrid_service, "diabtes", {"vector_weight": 0.0, "keyword_weight": 1.0})
    assert plain["metadata"]["technique_specific"]["keyword_candidates"] == 0
    fuzzy = hybrid(
        hybrid_service,
        "diabtes",
        {"vector_weight": 0.0, "keyword_weight": 1.0, "enable_fuzzy_matching": True},
    )
    specific = fuzzy["metadata"]["technique_specific"]
    assert specific["fuzzy_expansions"] == {"diabtes": ["diabet"]}
    assert specific["keyword_candidates"] == 1, "one repaired term, one matching chunk: no flood"
    assert ids(fuzzy)[0] == "insulin"
    assert repair_terms(["zzzzqqq"], {"diabet": 3}).expansions == {}
    assert repair_terms(["cel"], {"cell": 3}).expansions == {}, "short terms are never repaired"


def test_keyword_boost_fields(hybrid_service: RagService) -> None:
    base = {"vector_weight": 0.0, "keyword_weight": 1.0}
    plain = hybrid(hybrid_service, "diabetes care", base, top_k=5)
    boosted = hybrid(hybrid_service, "diabetes care", {**base, "keyword_boost_fields": ["journal"]}, top_k=5)

    def keyword_score(result: dict[str, Any], doc_id: str) -> float:
        scores = [
            d["score_details"]["keyword_score"] for d in result["retrieved_documents"] if d["id"] == doc_id
        ]
        return float(scores[0])

    assert keyword_score(boosted, "insulin") == pytest.approx(2.0 * keyword_score(plain, "insulin"))
    title = hybrid(
        hybrid_service, "compound", {**base, "keyword_boost_fields": ["title"], "keyword_boost": 5.0}
    )
    untitled = hybrid(hybrid_service, "compound", base)
    assert keyword_score(title, "xk-417") > keyword_score(untitled, "xk-417")


def test_filters_apply_in_both_legs(hybrid_service: RagService) -> None:
    query = "diabetes insulin kinase volcano bread aspirin"
    for weights in (
        {"vector_weight": 1.0, "keyword_weight": 0.0},
        {"vector_weight": 0.0, "keyword_weight": 1.0},
    ):
        result = hybrid(hybrid_service, query, weights, top_k=5, filters={"year": {"gte": 2020}})
        assert set(ids(result)) == {"insulin", "volcano", "sourdough"}
        report = result["metadata"]["filters"]
        assert report["matched_documents"] == 3 and report["unknown_fields"] == []
    topic = hybrid(
        hybrid_service, query, top_k=5, filters={"topic": {"in": ["geology", "food"]}, "year": 2021}
    )
    assert ids(topic) == ["volcano"]
    dated = hybrid(hybrid_service, query, top_k=5, filters={"date": {"lt": "2019-01-01"}})
    assert ids(dated) == ["xk-417"]
    unknown = hybrid(hybrid_service, query, filters={"colour": "red"})
    assert unknown["retrieved_documents"] == []
    assert unknown["metadata"]["filters"]["unknown_fields"] == ["colour"]
    assert "colour" in unknown["metadata"]["filters"]["note"]


def test_keyword_index_follows_replace_and_delete(hybrid_service: RagService) -> None:
    keyword_only = {"vector_weight": 0.0, "keyword_weight": 1.0}
    assert ids(hybrid(hybrid_service, "basaltic", keyword_only)) == ["volcano"]
    hybrid_service.ingest(
        {"collection_id": "docs", "documents": [{"id": "volcano", "content": "Glaciers carve valleys."}]}
    )
    assert hybrid(hybrid_service, "basaltic", keyword_only)["retrieved_documents"] == []
    assert ids(hybrid(hybrid_service, "glaciers", keyword_only)) == ["volcano"]
    assert hybrid_service.store.delete_document("docs", "volcano")
    assert hybrid(hybrid_service, "glaciers", keyword_only)["retrieved_documents"] == []
    dense = hybrid(hybrid_service, "glaciers", {"vector_weight": 1.0, "keyword_weight": 0.0}, top_k=5)
    assert "volcano" not in ids(dense)


FAQ = [
    ("faq01", "How do I reset my password?", "Go to Settings > Account > Reset password. We email a link."),
    ("faq02", "Can I change my username?", "Usernames can be changed once every 30 days under Settings."),
    ("faq03", "What payment methods do you accept?", "We accept Visa, Mastercard, PayPal and SEPA debit."),
    ("faq04", "How do I cancel my subscription?", "Open Billing > Subscription and press Cancel."),
    ("faq05", "Do you offer refunds?", "Refunds are available within 14 days of purchase."),
    ("faq06", "Is my data encrypted?", "All data is encrypted at rest with AES-256 and in transit with TLS."),
    ("faq07", "Do you support two-factor authentication?", "Enable 2FA under Settings > Security."),
    ("faq08", "Where are your servers located?", "Our servers are in Frankfurt and Dublin."),
    ("faq09", "How do I export my data?", "Use Settings > Privacy > Export to download a ZIP of your files."),
    ("faq10", "How do I delete my account?", "Settings > Privacy > Delete account removes your account."),
    ("faq11", "What are your support hours?", "Support is available Monday to Friday, 9:00 to 18:00 CET."),
    ("faq12", "Is there a mobile app?", "Our app is available for iOS and Android."),
]


def test_terms_in_half_the_chunks_are_no_keyword_evidence(any_service: RagService) -> None:
    """'my' is in 7 of 12 FAQ entries, the only query term BM25 finds: FTS5 floors its IDF at 1e-6.

    Divided by the best such score, those near-zero scores weighed as much as a real match and pushed the
    refunds entry, the dense leg's clear first, out of the top 3. Every store computes FTS5's BM25 alike.
    """
    service = any_service
    documents = [{"id": i, "title": t, "content": c} for i, t, c in FAQ]
    service.ingest({"collection_id": "faq", "documents": documents})
    arguments = {"query": "can I get my money back", "collection_id": "faq", "options": {"top_k": 3}}
    basic = service.execute({"technique": "basic", "arguments": arguments})
    assert ids(basic)[0] == "faq05"
    result = service.execute({"technique": "hybrid_ifind", "arguments": arguments})
    assert ids(result)[0] == "faq05"
    assert result["metadata"]["technique_specific"]["keyword_candidates"] == 0
    # A real match still counts: "refunds" is in one entry.
    refunds = {**arguments, "query": "refunds for my order"}
    found = service.execute({"technique": "hybrid_ifind", "arguments": refunds})
    assert ids(found)[0] == "faq05"
    assert found["retrieved_documents"][0]["score_details"]["keyword_score"] > 0.1
    assert found["metadata"]["technique_specific"]["keyword_candidates"] == 1


def test_the_evidence_floor_bounds_what_common_terms_alone_can_score() -> None:
    flat = KeywordQuery({"my": 1, "account": 2}, title_weight=2.0)
    assert flat.floor_score() == pytest.approx(1e-6 * 2.2 * 3)
    multifield = KeywordQuery({"my": 1}, title_weight=2.0, scoring="multifield")
    assert multifield.floor_score() == pytest.approx(1e-6 * 2.2 * 1.5 * 2.0)
    hits = [ScoredChunk("a#0", 0.7), ScoredChunk("b#0", 5e-6), ScoredChunk("c#0", 1e-6)]
    assert [h.chunk_id for h in flat.with_evidence(hits)] == ["a#0"]

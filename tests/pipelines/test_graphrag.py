"""rag_graphrag on a real store and model: a two-hop answer, every parameter, filters, explore."""

from typing import Any

import jsonschema
import pytest

from iris_rag.errors import InvalidParametersError
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from tests.conftest import DOCUMENTS

# Metformin activates AMPK (document 1); AMPK shuts down mTORC1 through raptor (document 2). A question
# that names metformin and asks what it ultimately switches off needs both. Document 2 never mentions
# metformin, and three diabetes documents are closer to the question than it is (checked below), so dense
# retrieval misses it.
TWO_HOP = [
    {
        "id": "metformin-ampk",
        "title": "Metformin acts on liver cells",
        "content": "Metformin activates AMP-activated protein kinase (AMPK) in hepatocytes.",
        "metadata": {"topic": "pharmacology", "year": 2011},
    },
    {
        "id": "ampk-mtorc1",
        "title": "Raptor phosphorylation",
        "content": "AMPK phosphorylates raptor, which shuts down mTORC1 activity.",
        "metadata": {"topic": "cell biology", "year": 2008},
    },
    {
        "id": "sulfonylurea",
        "title": "Sulfonylureas",
        "content": "Sulfonylureas stimulate insulin secretion from pancreatic beta cells "
        "and lower blood sugar.",
        "metadata": {"topic": "pharmacology", "year": 2015},
    },
    {
        "id": "insulin",
        "title": "Insulin therapy",
        "content": "Patients with type 2 diabetes often need insulin when oral drugs fail. "
        "Glucose monitoring guides the dose.",
        "metadata": {"topic": "endocrinology", "year": 2022},
    },
    {
        "id": "sglt2",
        "title": "SGLT2 inhibitors",
        "content": "SGLT2 inhibitors block glucose reabsorption in the kidney, "
        "so glucose leaves in the urine.",
        "metadata": {"topic": "pharmacology", "year": 2019},
    },
]
QUESTION = "What does metformin ultimately switch off?"


@pytest.fixture
def graph_service(service: RagService) -> RagService:
    result = service.ingest({"collection_id": "docs", "documents": TWO_HOP + DOCUMENTS})
    assert result["ingested_count"] == 8
    return service


def graphrag(
    service: RagService, query: str = QUESTION, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    arguments: dict[str, Any] = {"query": query, "collection_id": "docs", "technique_params": params or {}}
    arguments["options"] = {"generate": False, **options}
    return service.execute({"technique": "graphrag", "arguments": arguments})


def basic(service: RagService, query: str = QUESTION, **options: Any) -> dict[str, Any]:
    arguments = {"query": query, "collection_id": "docs", "options": {"generate": False, **options}}
    return service.execute({"technique": "basic", "arguments": arguments})


def ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


def test_two_hop_answer_needs_two_hops_and_the_graph(graph_service: RagService) -> None:
    # Honest: on its own, the second document is not similar to the question.
    everything = basic(graph_service, top_k=8)
    assert ids(everything).index("ampk-mtorc1") >= 4, ids(everything)
    assert "ampk-mtorc1" not in ids(basic(graph_service, top_k=3))

    two = graphrag(graph_service, params={"max_hops": 2}, top_k=3)
    assert "ampk-mtorc1" in ids(two), ids(two)
    one = graphrag(graph_service, params={"max_hops": 1}, top_k=3)
    assert "ampk-mtorc1" not in ids(one), ids(one)

    found = next(d for d in two["retrieved_documents"] if d["id"] == "ampk-mtorc1")
    details = found["score_details"]
    assert details["hop"] == 2 and details["graph_score"] > 0
    path = details["paths"][0]
    assert path["entities"][:2] == ["metformin", "AMP-activated protein kinase"]
    assert [r["type"] for r in path["relations"]] == ["co_occurs", "co_occurs"]
    assert found["similarity_score"] == pytest.approx(
        0.5 * details["vector_score"] + 0.5 * details["graph_score"], abs=1e-5
    )
    specific = two["metadata"]["technique_specific"]
    assert specific["max_hops"] == 2 and specific["extractor"] == "rules"
    assert (
        len(specific["entities_by_hop"]) == 3
        and len(one["metadata"]["technique_specific"]["entities_by_hop"]) == 2
    )
    linked = specific["entity_context"]["linked_entities"]
    assert linked[0]["name"] == "metformin" and linked[0]["match"] == "exact"
    assert specific["entity_context"]["document_paths"]["ampk-mtorc1"] == details["paths"]
    assert specific["used_chunk_ids"] == [d["chunk_id"] for d in two["retrieved_documents"]]


def test_relationship_weight_moves_from_vectors_to_the_graph(graph_service: RagService) -> None:
    vectors_only = graphrag(graph_service, params={"relationship_weight": 0.0}, top_k=5)
    assert ids(vectors_only) == ids(basic(graph_service, top_k=5))
    for document in vectors_only["retrieved_documents"]:
        assert document["similarity_score"] == pytest.approx(
            document["score_details"]["vector_score"], abs=1e-6
        )

    graph_only = graphrag(graph_service, params={"relationship_weight": 1.0}, top_k=5)
    scores = [d["score_details"]["graph_score"] for d in graph_only["retrieved_documents"]]
    assert scores == sorted(scores, reverse=True)
    assert ids(graph_only)[:2] == ["metformin-ampk", "ampk-mtorc1"]
    assert ids(graph_only) != ids(vectors_only)


def test_entity_threshold_decides_fuzzy_and_embedding_links(graph_service: RagService) -> None:
    misspelt = "What does metfromin switch off?"
    lenient = graphrag(graph_service, misspelt, {"entity_threshold": 0.7})
    linked = lenient["metadata"]["technique_specific"]["entity_context"]["linked_entities"]
    assert any(e["name"] == "metformin" and e["match"] in ("fuzzy", "embedding") for e in linked), linked
    assert all(e["confidence"] >= 0.7 for e in linked)
    strict = graphrag(graph_service, misspelt, {"entity_threshold": 0.99})
    assert strict["metadata"]["technique_specific"]["linked_entity_count"] == 0
    assert not any(d["score_details"]["graph_score"] for d in strict["retrieved_documents"])
    # Exact names link whatever the threshold.
    exact = graphrag(graph_service, params={"entity_threshold": 1.0})
    assert exact["metadata"]["technique_specific"]["linked_entity_count"] >= 1


def test_include_entity_context_false_returns_counts_only(graph_service: RagService) -> None:
    result = graphrag(graph_service, params={"include_entity_context": False}, top_k=3)
    specific = result["metadata"]["technique_specific"]
    assert "entity_context" not in specific and specific["linked_entity_count"] >= 1
    assert all("paths" not in d["score_details"] for d in result["retrieved_documents"])
    assert ids(result) == ids(graphrag(graph_service, top_k=3)), "the context changes nothing else"


def test_filters_apply_to_the_walk_and_the_vectors(graph_service: RagService) -> None:
    # Without the metformin document, nothing connects metformin to AMPK any more.
    result = graphrag(graph_service, top_k=8, filters={"topic": {"in": ["cell biology", "endocrinology"]}})
    assert set(ids(result)) == {"ampk-mtorc1", "insulin"}
    assert all(d["score_details"]["graph_score"] == 0 for d in result["retrieved_documents"])
    assert result["metadata"]["filters"]["matched_documents"] == 2
    # The walk itself goes through allowed evidence only.
    kept = graphrag(graph_service, top_k=8, filters={"year": {"lte": 2011}})
    assert set(ids(kept)) == {"metformin-ampk", "ampk-mtorc1"}
    assert (
        next(d for d in kept["retrieved_documents"] if d["id"] == "ampk-mtorc1")["score_details"]["hop"] == 2
    )


def test_generate_and_invalid_parameters(graph_service: RagService) -> None:
    assert graphrag(graph_service)["answer"] is None
    answered = graph_service.execute(
        {"technique": "graphrag", "arguments": {"query": QUESTION, "collection_id": "docs"}}
    )
    assert answered["answer"] and answered["metadata"]["answer_source"] == "extractive"
    for bad in ({"max_hops": 0}, {"max_hops": 6}, {"entity_threshold": 1.5}, {"relationship_weight": -0.1}):
        with pytest.raises(InvalidParametersError):
            graphrag(graph_service, params=bad)


def test_explore_shows_neighbours_relation_types_and_evidence(graph_service: RagService) -> None:
    explore = graph_service.methods()["graph_explore"]
    spec = tool_spec("rag_graph_explore")
    assert spec is not None and spec["bridge"] == {"method": "graph_explore"}
    result = explore({"entity": "AMPK", "collection_id": "docs"})
    jsonschema.validate(result, spec["outputSchema"])
    entity = result["entity"]
    assert entity["name"] == "AMP-activated protein kinase" and entity["aliases"] == ["AMPK"]
    assert entity["match"] == {"method": "alias", "confidence": 1.0}
    assert entity["document_count"] == 2
    neighbours = {n["entity"]["name"]: n for n in result["neighbours"]}
    assert {"metformin", "raptor", "hepatocytes"} <= set(neighbours)
    evidence = neighbours["raptor"]["relations"][0]["evidence"][0]
    assert evidence["document_id"] == "ampk-mtorc1" and "phosphorylates raptor" in evidence["snippet"]
    assert result["neighbour_count"] == len(result["neighbours"])

    assert len(explore({"entity": "AMPK", "collection_id": "docs", "limit": 1})["neighbours"]) == 1
    bare = explore({"entity": "AMPK", "collection_id": "docs", "evidence_per_relation": 0})
    assert all(not r["evidence"] for n in bare["neighbours"] for r in n["relations"])
    assert (
        explore({"entity": "AMPK", "collection_id": "docs", "relation_type": "inhibits"})["neighbours"] == []
    )
    fuzzy = explore({"entity": "metformine", "collection_id": "docs"})
    assert fuzzy["entity"]["name"] == "metformin" and fuzzy["entity"]["match"]["method"] in (
        "fuzzy",
        "embedding",
    )

    missing = explore({"entity": "xylophone quartet", "collection_id": "docs"})
    jsonschema.validate(missing, spec["outputSchema"])
    assert missing["found"] is False and len(missing["suggestions"]) == 5
    with pytest.raises(InvalidParametersError):
        explore({"entity": "AMPK", "collection_id": "docs", "limit": 0})


def test_served_tools(graph_service: RagService) -> None:
    names = {tool["name"] for tool in graph_service.describe()["tools"]}
    assert {"rag_graphrag", "rag_graph_explore"} <= names
    assert graph_service.tool_for("graph_explore", {}) == ("rag_graph_explore", None)

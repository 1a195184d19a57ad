"""rag_graphrag on a real store and model: a two-hop answer, every parameter, filters, explore."""

import logging
import math
from typing import Any

import jsonschema
import numpy as np
import pytest

from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError, RequestCancelledError
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import cache_key
from iris_rag.techniques.graphrag.index import EntityTable
from iris_rag.techniques.graphrag.pipeline import (
    FuzzyKeys,
    GraphRagPipeline,
    Walk,
    link_entities,
    query_phrases,
)
from iris_rag.techniques.graphrag.storage import EntityRow, RelationRow
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


def _ingest_two_hop(service: RagService) -> RagService:
    result = service.ingest({"collection_id": "docs", "documents": TWO_HOP + DOCUMENTS})
    assert result["ingested_count"] == 8
    return service


@pytest.fixture
def graph_service(service: RagService) -> RagService:
    return _ingest_two_hop(service)


@pytest.fixture
def any_graph_service(any_service: RagService) -> RagService:
    """The two-hop collection on each backend."""
    return _ingest_two_hop(any_service)


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


def test_two_hop_answer_needs_two_hops_and_the_graph(any_graph_service: RagService) -> None:
    # Honest: on its own, the second document is not similar to the question.
    everything = basic(any_graph_service, top_k=8)
    assert ids(everything).index("ampk-mtorc1") >= 4, ids(everything)
    assert "ampk-mtorc1" not in ids(basic(any_graph_service, top_k=3))

    two = graphrag(any_graph_service, params={"max_hops": 2}, top_k=3)
    assert "ampk-mtorc1" in ids(two), ids(two)
    one = graphrag(any_graph_service, params={"max_hops": 1}, top_k=3)
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

    # No name of the graph is spelt like "liver cells": only the embedding of the name hepatocytes is close
    # (cosine about 0.78 with all-MiniLM-L6-v2).
    synonym = "What happens in liver cells?"
    close = graphrag(graph_service, synonym, {"entity_threshold": 0.7})
    linked = close["metadata"]["technique_specific"]["entity_context"]["linked_entities"]
    hepatocytes = next(e for e in linked if e["name"] == "hepatocytes")
    assert hepatocytes["match"] == "embedding" and 0.7 <= hepatocytes["confidence"] < 0.9
    far = graphrag(graph_service, synonym, {"entity_threshold": 0.9})
    linked = far["metadata"]["technique_specific"]["entity_context"]["linked_entities"]
    assert all(e["name"] != "hepatocytes" for e in linked)


def _table(names: list[tuple[str, str]], vectors: np.ndarray, aliases: dict[str, list[int]]) -> EntityTable:
    rows = [EntityRow(i + 1, key, name, "term", 1, 1) for i, (key, name) in enumerate(names)]
    return EntityTable(
        documents=10,
        rows=rows,
        row_of_id={r.id: i for i, r in enumerate(rows)},
        id_of_key={r.key: r.id for r in rows},
        ids_of_alias=aliases,
        keys=[r.key for r in rows],
        vector_rows=np.arange(len(rows), dtype=np.int64),
        vectors=vectors.astype(np.float32),
    )


def test_each_link_method_and_the_threshold_it_obeys() -> None:
    names = [("metformin", "metformin"), ("tumor necrosis factor", "tumor necrosis factor")]
    names += [("brca2", "BRCA2"), ("hepatocyte", "hepatocytes")]
    # Entity i's name vector is the unit vector e_i; a phrase's vector is chosen per case below.
    table = _table(names, np.eye(4, 5), {"tnf": [2]})

    def link(phrase: str, vector: list[float], threshold: float) -> list[tuple[str, str, float]]:
        found = link_entities([phrase], np.array([vector], dtype=np.float32), table, threshold)
        return [(e.entity.name, e.method, round(e.confidence, 4)) for e in found]

    nowhere = [0.0, 0.0, 0.0, 0.0, 1.0]  # orthogonal to every name: no embedding link
    # Exact names and defined abbreviations are certain, at any threshold.
    assert link("Metformin", nowhere, 1.0) == [("metformin", "exact", 1.0)]
    assert link("TNF", nowhere, 1.0) == [("tumor necrosis factor", "alias", 1.0)]
    # Fuzzy: edit similarity of the keys (0.8889 for one transposition) against the threshold.
    assert link("metfromin", nowhere, 0.7) == [("metformin", "fuzzy", 0.8889)]
    assert link("metfromin", nowhere, 0.9) == []
    # ... and never across different numbers: BRCA1 is not BRCA2 (edit similarity 0.8).
    assert link("BRCA1", nowhere, 0.5) == []
    # Embedding: the cosine of the phrase and the name (0.8 here), against the threshold.
    near_hepatocytes = [0.0, 0.0, 0.0, 0.8, 0.6]
    assert link("liver cells", near_hepatocytes, 0.7) == [("hepatocytes", "embedding", 0.8)]
    assert link("liver cells", near_hepatocytes, 0.85) == []
    # A certain link is not replaced by a weaker one of another kind.
    assert link("Metformin", [0.9, 0.0, 0.0, 0.0, 0.436], 0.5) == [("metformin", "exact", 1.0)]


# ZRB1 co-occurs with KRB2 in two sentences and with PLM3 in one; KRB2 -> QXT4 and PLM3 -> WNV5 are stated in
# other documents. Both QXT4 and WNV5 are two hops from ZRB1, through entities equally specific.
WEIGHTED = [
    {"id": "hub", "content": "ZRB1 activates KRB2. ZRB1 binds KRB2 tightly. ZRB1 inhibits PLM3."},
    {"id": "via-krb2", "content": "KRB2 phosphorylates QXT4. Then KRB2 activates QXT4."},
    {"id": "via-plm3", "content": "PLM3 phosphorylates WNV5."},
]


def test_relation_weights_along_the_path_set_the_graph_score(service: RagService) -> None:
    service.ingest({"collection_id": "docs", "documents": WEIGHTED})
    query = "What does ZRB1 control in the end?"

    def graph_scores() -> dict[str, float]:
        result = graphrag(service, query, {"relationship_weight": 1.0}, top_k=3)
        found = {d["id"]: d["score_details"] for d in result["retrieved_documents"]}
        assert found["via-krb2"]["hop"] == found["via-plm3"]["hop"] == 2
        return {k: v["graph_score"] for k, v in found.items()}

    result = graphrag(service, query, top_k=3)
    paths = {d["id"]: d["score_details"]["paths"][0] for d in result["retrieved_documents"]}
    assert [r["weight"] for r in paths["via-krb2"]["relations"]] == [2, 2]
    assert [r["weight"] for r in paths["via-plm3"]["relations"]] == [1, 1]
    # The weaker first step (weight 1 of the strongest 2 at ZRB1) costs log(2)/log(3); the second steps are
    # each their entity's strongest relation.
    scores = graph_scores()
    assert scores["via-plm3"] == pytest.approx(scores["via-krb2"] * math.log(2) / math.log(3), rel=1e-3)

    # State KRB2 -> QXT4 only once: that second step is now weight 1 of KRB2's strongest 2 and costs the same
    # log(2)/log(3), so both paths score the same.
    weaker = {"id": "via-krb2", "content": "KRB2 phosphorylates QXT4."}
    service.ingest({"collection_id": "docs", "documents": [weaker]})
    scores = graph_scores()
    assert scores["via-plm3"] == pytest.approx(scores["via-krb2"], rel=1e-6)


def test_each_further_hop_reaches_one_document_further(service: RagService) -> None:
    chain = [*WEIGHTED, {"id": "three-hops", "content": "QXT4 cleaves MNO6."}]
    service.ingest({"collection_id": "docs", "documents": chain})
    reached: dict[int, dict[str, int]] = {}
    for hops in (1, 2, 3, 5):
        result = graphrag(service, "What does ZRB1 control in the end?", {"max_hops": hops}, top_k=4)
        reached[hops] = {
            d["id"]: d["score_details"]["hop"]
            for d in result["retrieved_documents"]
            if d["score_details"]["graph_score"] > 0
        }
    assert reached[1] == {"hub": 0}
    assert reached[2] == {"hub": 0, "via-krb2": 2, "via-plm3": 2}
    assert reached[3] == {**reached[2], "three-hops": 3}
    assert reached[5] == reached[3], "nothing lies further"


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
    assert spec is not None and spec["bridge"] == {"method": "graph_explore", "served_by": "graphrag"}
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
    co_occurs = explore({"entity": "AMPK", "collection_id": "docs", "relation_type": "co_occurs"})
    assert co_occurs["neighbour_count"] == result["neighbour_count"]
    assert (
        explore({"entity": "AMPK", "collection_id": "docs", "relation_type": "inhibits"})["neighbours"] == []
    )
    fuzzy = explore({"entity": "metformine", "collection_id": "docs"})
    assert fuzzy["entity"]["name"] == "metformin" and fuzzy["entity"]["match"]["method"] in (
        "fuzzy",
        "embedding",
    )

    # A relation stated in a second document has two evidence chunks; evidence_per_relation caps them.
    again = {"id": "ampk-again", "content": "In muscle, metformin activates AMPK as well."}
    graph_service.ingest({"collection_id": "docs", "documents": [again]})

    def metformin_evidence(**arguments: Any) -> list[str]:
        result = explore({"entity": "AMPK", "collection_id": "docs", **arguments})
        neighbour = next(n for n in result["neighbours"] if n["entity"]["name"] == "metformin")
        return [e["document_id"] for e in neighbour["relations"][0]["evidence"]]

    assert sorted(metformin_evidence()) == ["ampk-again", "metformin-ampk"]
    assert len(metformin_evidence(evidence_per_relation=1)) == 1

    missing = explore({"entity": "xylophone quartet", "collection_id": "docs"})
    jsonschema.validate(missing, spec["outputSchema"])
    assert missing["found"] is False and len(missing["suggestions"]) == 5
    with pytest.raises(InvalidParametersError):
        explore({"entity": "AMPK", "collection_id": "docs", "limit": 0})


def test_served_tools(graph_service: RagService) -> None:
    names = {tool["name"] for tool in graph_service.describe()["tools"]}
    assert {"rag_graphrag", "rag_graph_explore"} <= names
    assert graph_service.tool_for("graph_explore", {}) == ("rag_graph_explore", None)


class EncodeSpy:
    """Records what the real embedder is asked to encode (it still encodes: a spy, not a double)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, embedder: Embedder) -> None:
        self.texts: list[list[str]] = []
        self.queries: list[str] = []
        self.asked: list[str] = []  # encode_query_async: one text, one thread, remembered
        encode, encode_query = embedder.encode, embedder.encode_query
        encode_query_async = embedder.encode_query_async

        def spy_encode(texts: list[str], **kwargs: Any) -> Any:
            self.texts.append(list(texts))
            return encode(texts, **kwargs)

        def spy_query(query: str) -> Any:
            self.queries.append(query)
            return encode_query(query)

        def spy_query_async(query: str) -> Any:
            self.asked.append(query)
            return encode_query_async(query)

        monkeypatch.setattr(embedder, "encode", spy_encode)
        monkeypatch.setattr(embedder, "encode_query", spy_query)
        monkeypatch.setattr(embedder, "encode_query_async", spy_query_async)


def _cold(settings: Settings, embedder: Embedder) -> RagService:
    """A new service on the same data folder: a freshly started worker, every cache empty."""
    return RagService(settings, embedder=embedder)


def _ranking(result: dict[str, Any]) -> list[tuple[str, float]]:
    return [(d["id"], d["similarity_score"]) for d in result["retrieved_documents"]]


def test_first_graph_call_after_ingest_encodes_only_the_query(
    graph_service: RagService,
    settings: Settings,
    embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Entity names are embedded at ingest and stored with the graph; a cold query only loads them."""
    spy = EncodeSpy(monkeypatch, embedder)
    cold = _cold(settings, embedder)
    try:
        explored = cold.methods()["graph_explore"]({"collection_id": "docs", "entity": "metformin"})
        assert explored["found"] and explored["neighbours"]
        assert spy.texts == [] and spy.queries == [] and spy.asked == []  # an exact name: nothing to encode
        first = graphrag(cold, top_k=5)
        phrases = query_phrases(QUESTION)
        assert phrases
        # The query as a query (remembered for the answer); its phrases that the ingest embedded (as
        # mention names) come from the embedding cache, the others in one batch; no entity name.
        cached = cold.store.cached_embeddings(settings.embedding_model_id, [cache_key(p) for p in phrases])
        assert cached, "the question names an entity of the documents: its vector was cached at ingest"
        unknown = [p for p in phrases if cache_key(p) not in cached]
        assert spy.asked == [QUESTION] and spy.texts == ([unknown] if unknown else [])
    finally:
        cold.close()

    # The old path (names embedded by the first query) gives the same answer: a graph stored before the
    # vectors were is still served, its names embedded once at query time with a warning to reindex.
    connection = sqlite_connection(graph_service.store)
    connection.execute("UPDATE kg_entities SET embedding = NULL")
    assert connection.execute("SELECT COUNT(*) FROM kg_entities").fetchone()[0] > 10
    connection.execute("DELETE FROM embedding_cache")
    spy.texts.clear()
    legacy = _cold(settings, embedder)
    try:
        with caplog.at_level(logging.WARNING):
            old = graphrag(legacy, top_k=5)
        # Every entity name (cached again as they are embedded), then the phrases that no name spells.
        assert len(spy.texts[0]) > 10 and all(set(batch) <= set(phrases) for batch in spy.texts[1:])
        assert "iris-rag reindex" in caplog.text
        assert [i for i, _ in _ranking(old)] == [i for i, _ in _ranking(first)]
        for (_, a), (_, b) in zip(_ranking(old), _ranking(first), strict=True):
            assert a == pytest.approx(b, abs=1e-5)
        assert (
            old["metadata"]["technique_specific"]["entity_context"]
            == first["metadata"]["technique_specific"]["entity_context"]
        )
        # A reindex stores the vectors: the next cold start embeds no name again.
        legacy.reindex("docs")
    finally:
        legacy.close()
    assert connection.execute("SELECT COUNT(*) FROM kg_entities WHERE embedding IS NULL").fetchone()[0] == 0


def test_the_extractive_answer_reuses_the_query_vector(
    graph_service: RagService, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the extractive answer on, the query reaches the model once per call: the answer's relevance
    check finds the vector retrieve() encoded (it was encoded twice: in a batch with the phrases, then
    alone)."""
    query = "Which kinase does metformin activate in the liver, asked once?"  # new to this session's model
    model_texts: list[str] = []
    encode, encode_one = embedder.encode, embedder._encode_one

    def spy_encode(texts: list[str], **kwargs: Any) -> Any:
        model_texts.extend(texts)
        return encode(texts, **kwargs)

    def spy_encode_one(model: Any, text: str) -> Any:
        model_texts.append(text)
        return encode_one(model, text)

    monkeypatch.setattr(embedder, "encode", spy_encode)
    monkeypatch.setattr(embedder, "_encode_one", spy_encode_one)
    result = graph_service.execute(
        {"technique": "graphrag", "arguments": {"query": query, "collection_id": "docs"}}
    )
    assert result["answer"] and result["metadata"]["answer_source"] == "extractive"
    assert "relevance" in result["metadata"]  # the query similarities were computed
    assert model_texts.count(query) == 1
    # Its phrases too, unless an earlier call of this session's model already encoded them.
    assert set(model_texts) <= {query, *query_phrases(query)}


def test_a_cancelled_call_stops_at_the_walk(
    graph_service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while the graph is walked: the next hop does not start, the call ends REQUEST_CANCELLED."""
    pipeline = graph_service.pipelines["graphrag"]
    assert isinstance(pipeline, GraphRagPipeline)
    token = CancelToken()
    hops: list[int] = []
    relations_of = pipeline.index.relations_of

    def cancelling_relations_of(collection_id: str, entity_ids: Any) -> Any:
        hops.append(1)
        token.cancel("test")
        return relations_of(collection_id, entity_ids)

    monkeypatch.setattr(pipeline.index, "relations_of", cancelling_relations_of)
    with cancellation_scope(token), pytest.raises(RequestCancelledError):
        graphrag(graph_service, params={"max_hops": 3})
    assert hops == [1]
    with cancellation_scope(CancelToken()):
        assert graphrag(graph_service, params={"max_hops": 3})["retrieved_documents"]


def test_fuzzy_keys_find_what_rapidfuzz_finds_over_every_key() -> None:
    """The character-count bound only leaves out keys that cannot reach the cutoff: same matches, order."""
    import random

    from rapidfuzz import fuzz, process

    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz0123456789- αβγé"
    keys = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 30))) for _ in range(3000)]
    keys += ["tumor necrosis factor", "tumour necrosis factor", "brca1", "brca2", "il-6", "il 6", "a" * 300]
    # Built over every key at once, and over a third first, then extended (a table brought up to date),
    # whose character columns come from the first third only (new characters share the last column).
    whole = FuzzyKeys(keys)
    extended = FuzzyKeys(keys[:1000]).extended(keys[:2000]).extended([*keys, "ωωω-ünïcode"])
    queries = [*rng.sample(keys, 40), "tumor necrosis factr", "brca", "il6", "a" * 299, "αβγ", "zzzz"]
    queries += ["".join(rng.choice(letters) for _ in range(rng.randint(4, 20))) for _ in range(40)]
    queries += ["ωωω-ünicode", "ünïcodeω"]
    for fuzzy, over in ((whole, keys), (extended, [*keys, "ωωω-ünïcode"])):
        for query in queries:
            for cutoff in (40.0, 70.0, 90.0):
                expected = process.extract(query, over, scorer=fuzz.ratio, score_cutoff=cutoff, limit=9)
                assert fuzzy.extract(query, cutoff, 9) == [tuple(item) for item in expected], (query, cutoff)
    assert FuzzyKeys([]).extract("brca1", 70.0, 9) == []
    assert FuzzyKeys([]).extended(["brca1"]).extract("brca1", 70.0, 9) == [("brca1", 100.0, 0)]


def test_walk_adds_each_relation_once_and_sums_an_edge_over_types() -> None:
    walk = Walk()
    walk.add_relation(RelationRow(1, 10, 20, "co_occurs", 3))
    walk.add_relation(RelationRow(2, 20, 10, "inhibits", 2))
    walk.add_relation(RelationRow(1, 10, 20, "co_occurs", 3))  # loaded again from the other end
    edge = walk.graph[10][20]
    assert walk.graph[20][10] is edge
    assert edge.weight == 5 and [r.id for r in edge.relations] == [1, 2]

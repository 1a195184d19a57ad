"""The knowledge-graph index: rule extraction, rows that follow documents, LLM extraction."""

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.embedder import Embedder
from iris_rag.errors import IndexNotBuiltError
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.graphrag.extraction import (
    RuleExtractor,
    entity_key,
    find_abbreviations,
    is_gene_like,
    parse_llm_graph,
)
from iris_rag.techniques.graphrag.index import KnowledgeGraphIndex
from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
from tests.fake_openai import FakeOpenAIServer


def _mentions(text: str) -> dict[str, set[str]]:
    """Entity key -> the surfaces that mention it."""
    graph = RuleExtractor().extract("", text)
    found: dict[str, set[str]] = {}
    for m in graph.mentions:
        found.setdefault(m.key, set()).add(text[m.start : m.end])
    return found


def test_entity_keys_ignore_case_hyphens_greek_and_plural() -> None:
    assert entity_key("IL-6") == entity_key("IL6") == entity_key("il 6") == "il6"
    assert entity_key("TNF-\u03b1") == entity_key("TNF-alpha") == entity_key("TNF\u03b1") == "tnfalpha"
    assert entity_key("Tumor necrosis factors") == entity_key("tumor necrosis factor")
    assert entity_key("Alzheimer's disease") == "alzheimer disease"
    assert entity_key("BRCA1") != entity_key("BRCA2")


def test_gene_and_chemical_like_tokens() -> None:
    for token in [
        "IL-6",
        "BRCA1",
        "p53",
        "TNF-\u03b1",
        "mRNA",
        "CD4+",
        "H2O2",
        "5-HT",
        "COVID-19",
        "NF-\u03baB",
    ]:
        assert is_gene_like(token), token
    for token in [
        "patients",
        "24h",
        "10mg",
        "CI",
        "CIs",
        "ORs",
        "III",
        "RESULTS",
        "AND",
        "The",
        "mg/kg",
        "3-fold",
    ]:
        assert not is_gene_like(token), token


def test_schwartz_hearst_abbreviations_both_ways() -> None:
    text = "Serum tumor necrosis factor (TNF) rose, and IL-6 (interleukin 6) fell."
    pairs = [(text[a:b], text[c:d]) for a, b, c, d in find_abbreviations(text)]
    assert pairs == [("TNF", "tumor necrosis factor"), ("IL-6", "interleukin 6")]
    # A parenthesis that is not an abbreviation defines nothing.
    assert find_abbreviations("Patients (n = 17) were treated (see below).") == []
    # Statistics abbreviations define nothing, in the plural either.
    assert find_abbreviations("Odds ratios (ORs) with 95% confidence intervals (CIs) were computed.") == []


def test_an_abbreviation_and_its_expansion_are_one_entity() -> None:
    text = (
        "Levels of tumor necrosis factor (TNF) were high. "
        "Later, TNF fell while BRCA1 and p53 were unchanged in breast cancer cells."
    )
    mentions = _mentions(text)
    assert mentions["tumor necrosis factor"] == {"tumor necrosis factor", "TNF"}
    assert "tnf" not in mentions, "the later TNF is the defined entity, not a second one"
    assert {"brca1", "p53", "breast cancer cell"} <= set(mentions)
    # Generic words and verbs are never entities.
    assert not {"level", "later", "fell", "unchanged", "were"} & set(mentions)


def test_names_and_multi_word_terms() -> None:
    text = "Amyloid plaques in Alzheimer's disease were studied in Drosophila by John Smith."
    kinds = {(m.key, m.type) for m in RuleExtractor().extract("", text).mentions}
    assert kinds == {
        ("amyloid plaque", "term"),
        ("alzheimer disease", "name"),
        ("drosophila", "name"),
        ("john smith", "name"),
    }
    # A term runs between function words, verbs and punctuation, at most four words, without leading
    # generic modifiers.
    mentions = _mentions("Several novel serum biomarkers significantly increased serum IL-6 levels.")
    assert {"serum biomarker", "serum il6 level", "il6"} <= set(mentions)
    assert not {"several novel serum biomarker", "novel serum biomarker"} & set(mentions)
    # Units, compound ones included, and "and/or" end a term and are never entities.
    mentions = _mentions("Folic acid at 5 mg/d lowered homocysteine (12 micromol/L) and/or cholesterol.")
    assert set(mentions) == {"folic acid", "homocysteine", "cholesterol"}


def test_relations_are_sentence_co_occurrences_weighted_by_count() -> None:
    graph = RuleExtractor().extract(
        "Metformin and AMPK",
        "Metformin activates AMPK in hepatocytes. Volcanic ash covered Iceland.",
    )
    pairs = {(r.source, r.target) for r in graph.relations}
    assert ("ampk", "metformin") in pairs and ("hepatocyte", "metformin") in pairs
    # Nothing links the two sentences.
    assert not any("iceland" in p and "metformin" in p for p in pairs)
    # The title is a sentence too: metformin and AMPK co-occur twice.
    assert sum(1 for r in graph.relations if (r.source, r.target) == ("ampk", "metformin")) == 2
    assert {r.type for r in graph.relations} == {"co_occurs"}


def test_llm_reply_parsing_tolerates_fences_and_rejects_garbage() -> None:
    parsed = parse_llm_graph('```json\n{"entities": [{"name": "AMPK", "type": "protein"}]}\n```')
    assert parsed.entities[0].name == "AMPK"
    with pytest.raises(Exception, match="no JSON"):
        parse_llm_graph("I cannot help with that.")


# The index inside the service
def _rows(service: RagService, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in sqlite_connection(service.store).execute(sql, args).fetchall()]


def _graph(service: RagService) -> KnowledgeGraphStorage:
    return service.store.technique_storage(KnowledgeGraphStorage)


def _entity_ids(service: RagService, collection: str = "kg") -> dict[str, int]:
    """Entity key -> id, read through the storage contract (so on either backend)."""
    return {e.row.key: e.row.id for e in _graph(service).entities(collection, min_documents=1)}


def _entity_names(service: RagService, collection: str = "kg") -> set[str]:
    return set(_entity_ids(service, collection))


def _relation(service: RagService, a: str, b: str) -> tuple[int, list[str]] | None:
    """Weight and evidence chunks of the co_occurs relation between two entity keys."""
    ids = _entity_ids(service)
    if a not in ids or b not in ids:
        return None
    ends = {ids[a], ids[b]}
    graph = _graph(service)
    found = [r for r in graph.relations_of("kg", list(ends)) if {r.source_id, r.target_id} == ends]
    if not found:
        return None
    return found[0].weight, sorted(e.chunk_id for e in graph.evidence_of([found[0].id]))


DOCS = [
    {
        "id": "a",
        "title": "TNF in obesity",
        "content": "Tumor necrosis factor (TNF) is raised in obesity. TNF and leptin are high in obesity.",
    },
    {
        "id": "b",
        "title": "Leptin",
        "content": "Leptin is a satiety hormone. TNF and leptin are high in obesity.",
    },
]


def test_rows_follow_documents_through_ingest_replace_and_delete(any_service: RagService) -> None:
    service = any_service
    service.ingest({"collection_id": "kg", "documents": DOCS})
    # Mentions point at their chunk and offsets in the field they are in.
    keys = {i: k for k, i in _entity_ids(service).items()}
    for mention in _graph(service).mentions_of(list(keys)):
        document = service.store.get_document("kg", mention.document_id)
        assert document is not None and mention.chunk_id == f"{mention.document_id}#0"
        text = document.title if mention.field == "title" else document.content
        key = keys[mention.entity_id]
        assert (
            entity_key(text[mention.start_char : mention.end_char]) == key or key == "tumor necrosis factor"
        )
    # TNF is defined in a and only used in b: one entity for both.
    assert "tnf" not in _entity_names(service)
    # leptin and obesity share one sentence in a and one in b; TNF and obesity the title and two sentences
    # of a, and one sentence of b (where TNF is used without being defined).
    assert _relation(service, "leptin", "obesity") == (2, ["a#0", "b#0"])
    assert _relation(service, "obesity", "tumor necrosis factor") == (4, ["a#0", "b#0"])

    # Deleting b takes its evidence off the weights; entities only b mentioned go.
    assert service.store.delete_document("kg", "b")
    assert _relation(service, "leptin", "obesity") == (1, ["a#0"])
    assert _relation(service, "obesity", "tumor necrosis factor") == (3, ["a#0"])
    assert "satiety hormone" not in _entity_names(service)
    ids = list(_entity_ids(service).values())
    assert {m.document_id for m in _graph(service).mentions_of(ids)} == {"a"}

    # Replacing a with a text about something else removes every relation it alone supported.
    service.ingest(
        {"collection_id": "kg", "documents": [{"id": "a", "content": "Volcanic ash covered Iceland."}]}
    )
    assert _relation(service, "leptin", "obesity") is None
    assert "obesity" not in _entity_names(service)
    ids = list(_entity_ids(service).values())
    assert all(r.weight > 0 for r in _graph(service).relations_of("kg", ids))
    entities = _graph(service).entities("kg", min_documents=1)
    assert entities and all(e.row.mention_count >= 1 and e.row.document_count == 1 for e in entities)
    assert _graph(service).indexed_documents("kg") == 1


def test_an_abbreviation_defined_in_an_earlier_ingest_resolves_later_uses(service: RagService) -> None:
    service.ingest({"collection_id": "kg", "documents": [DOCS[0]]})
    service.ingest(
        {"collection_id": "kg", "documents": [{"id": "c", "content": "TNF blockade eased arthritis."}]}
    )
    assert "tnf" not in _entity_names(service)
    rows = _rows(
        service,
        """SELECT e.key FROM kg_mentions m JOIN kg_entities e ON e.id = m.entity_id
           WHERE m.document_id = 'c' AND m.start_char = 0 AND m.end_char = 3""",
    )
    assert rows == [("tumor necrosis factor",)]


def test_graph_statistics_in_health_details(service: RagService) -> None:
    service.ingest({"collection_id": "kg", "documents": DOCS})
    service.ingest(
        {"collection_id": "kg", "documents": [{"id": "z", "content": "Basaltic lava covered Iceland."}]}
    )
    details = service.health_check({"include_details": True})["components"]["vector_store"]["details"]
    stats = details["technique_indexes"]["knowledge_graph"]["collections"]["kg"]
    graph = nx.Graph(
        _rows(service, "SELECT source_id, target_id FROM kg_relations WHERE collection_id = 'kg'")
    )
    assert stats["documents"] == 3
    assert stats["entities"] == len(_entity_names(service))
    assert stats["relations"] == graph.number_of_edges()
    assert stats["largest_component"] == max(len(c) for c in nx.connected_components(graph))
    assert stats["largest_component"] < stats["entities"], "Iceland's sentence is its own component"
    assert stats["extractor"] == "rules" and stats["extractors"] == {"rules": 3}


def test_the_largest_component_is_computed_again_only_when_the_relations_moved(
    service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health details read every relation for it: after a write that barely moves the graph, they do not."""
    service.ingest({"collection_id": "kg", "documents": DOCS})
    index = service.pipelines["graphrag"].technique_index()
    assert isinstance(index, KnowledgeGraphIndex)
    reads: list[str] = []
    read = index.graph.relation_ends

    def counted(collection_id: str) -> list[tuple[int, int]]:
        reads.append(collection_id)
        return read(collection_id)

    monkeypatch.setattr(index.graph, "relation_ends", counted)
    version = service.store.data_version("kg")
    size = index.largest_component("kg", version, 1000)
    assert size > 1 and len(reads) == 1
    assert index.largest_component("kg", version + 1, 1010) == size and len(reads) == 1, "within 1 %: kept"
    index.largest_component("kg", version + 2, 1011)
    assert len(reads) == 2, "past 1 % of the count it was computed at"
    index.largest_component("kg", version + 2 + 64, 1011)
    assert len(reads) == 3, "64 writes later"


def test_a_collection_ingested_before_the_graph_needs_a_reindex(
    service: RagService, settings: Settings, embedder: Embedder
) -> None:
    # Ingest without the graph index, as a server from before this technique did.
    Ingestor(settings, service.store, embedder, []).ingest(
        "old", [SourceDocument(d["id"], d["content"], d["title"]) for d in DOCS]
    )
    arguments = {"query": "TNF and obesity", "collection_id": "old"}
    with pytest.raises(IndexNotBuiltError, match="reindex"):
        service.execute({"technique": "graphrag", "arguments": arguments})
    with pytest.raises(IndexNotBuiltError):
        service.methods()["graph_explore"]({"entity": "TNF", "collection_id": "old"})
    assert "graphrag" in service.stale_indexes("old")
    service.reindex("old")
    result = service.execute({"technique": "graphrag", "arguments": arguments})
    assert result["retrieved_documents"]


# LLM extraction, against the fake OpenAI-compatible server
LLM_REPLY = json.dumps(
    {
        "entities": [
            {"name": "Metformin", "type": "Drug"},
            {"name": "AMPK", "type": "protein"},
            {"name": "unicorn", "type": "animal"},
        ],
        "relations": [
            {"source": "Metformin", "target": "AMPK", "type": "activates"},
            {"source": "Metformin", "target": "unicorn", "type": "rides"},
        ],
    }
)


@pytest.fixture
def llm_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(reply=f"Here is the graph:\n```json\n{LLM_REPLY}\n```")
    yield server
    server.close()


def _llm_service(tmp_path: Path, server: FakeOpenAIServer, embedder: Embedder) -> RagService:
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "llm",
        LLM_PROVIDER="openai",
        LLM_MODEL="fake-extractor",
        LLM_API_KEY="sk-test",
        LLM_BASE_URL=server.base_url,
        LLM_MAX_RETRIES=0,
    )
    return RagService(settings, embedder=embedder)


def test_llm_extracts_typed_entities_and_directed_relations(
    tmp_path: Path, embedder: Embedder, llm_server: FakeOpenAIServer
) -> None:
    service = _llm_service(tmp_path, llm_server, embedder)
    try:
        text = "Metformin strongly activates AMPK in liver cells; AMPK then restrains growth."
        service.ingest({"collection_id": "kg", "documents": [{"id": "m", "title": "Drugs", "content": text}]})
        body = llm_server.requests[0]["body"]
        assert body["model"] == "fake-extractor" and body["temperature"] == 0.0
        assert text in body["messages"][1]["content"] and "Title: Drugs" in body["messages"][1]["content"]
        entities = _rows(service, "SELECT key, name, type, mention_count FROM kg_entities ORDER BY key")
        # Every entity is grounded in the text (both AMPKs are mentions); the unicorn is not in it.
        assert entities == [("ampk", "AMPK", "protein", 2), ("metformin", "Metformin", "drug", 1)]
        relations = _rows(
            service,
            """SELECT s.key, t.key, r.type, r.weight FROM kg_relations r
               JOIN kg_entities s ON s.id = r.source_id JOIN kg_entities t ON t.id = r.target_id""",
        )
        assert relations == [("metformin", "ampk", "activates", 1)]
        assert _rows(service, "SELECT extractor, llm_model FROM kg_collections") == [
            ("llm", "fake-extractor")
        ]
        result = service.execute(
            {
                "technique": "graphrag",
                "arguments": {"query": "What does metformin activate?", "collection_id": "kg"},
            }
        )
        assert result["metadata"]["technique_specific"]["extractor"] == "llm"
        assert result["metadata"]["technique_specific"]["llm_model"] == "fake-extractor"
        explored = service.methods()["graph_explore"]({"entity": "metformin", "collection_id": "kg"})
        relation = explored["neighbours"][0]["relations"][0]
        assert (relation["type"], relation["direction"]) == ("activates", "outgoing")
    finally:
        service.close()


@pytest.mark.parametrize("reply,status", [("not json at all", 200), (LLM_REPLY, 500)])
def test_llm_failure_falls_back_to_the_rules_and_says_so(
    tmp_path: Path, embedder: Embedder, reply: str, status: int
) -> None:
    server = FakeOpenAIServer(reply=reply, status=status)
    service = _llm_service(tmp_path, server, embedder)
    try:
        service.ingest(
            {"collection_id": "kg", "documents": [{"id": "m", "content": "Metformin activates AMPK."}]}
        )
        assert len(server.requests) == 1
        assert _rows(service, "SELECT extractor FROM kg_documents") == [("rules_fallback",)]
        assert _rows(service, "SELECT extractor FROM kg_collections") == [("rules_fallback",)]
        assert {"metformin", "ampk"} <= _entity_names(service, "kg")
        note = _rows(service, "SELECT note FROM kg_documents")[0][0]
        assert note and ("LLM" in note or "JSON" in note)
    finally:
        service.close()
        server.close()


def test_a_reply_that_is_not_a_chat_completion_falls_back_to_the_rules(
    tmp_path: Path, embedder: Embedder, llm_server: FakeOpenAIServer
) -> None:
    """A proxy's HTML page (200, text/html) is the LLM failing like any other: the rules extract."""
    llm_server.raw_reply = ("text/html", "<html>login</html>")
    service = _llm_service(tmp_path, llm_server, embedder)
    try:
        service.ingest(
            {"collection_id": "kg", "documents": [{"id": "m", "content": "Metformin activates AMPK."}]}
        )
        assert _rows(service, "SELECT extractor FROM kg_documents") == [("rules_fallback",)]
        assert {"metformin", "ampk"} <= _entity_names(service, "kg")
        note = _rows(service, "SELECT note FROM kg_documents")[0][0]
        assert "not a chat completion" in note and llm_server.base_url in note
    finally:
        service.close()


def test_index_tables_live_in_the_store_file(service: RagService) -> None:
    tables = {
        r[0]
        for r in sqlite3.connect(service.settings.database_path).execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
    }
    assert {
        "kg_collections",
        "kg_documents",
        "kg_entities",
        "kg_mentions",
        "kg_relations",
        "kg_evidence",
    } <= tables

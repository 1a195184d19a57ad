"""rag_noderag on a real store and model: node paths, every parameter, the three aggregations, filters."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.embedder import Embedder
from iris_rag.errors import IndexNotBuiltError, InvalidParametersError
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS
from tests.fake_openai import FakeOpenAIServer

GUIDE = """Aspirin is one of the oldest drugs still in use. It was first made from willow bark.

# Benefits
Daily low-dose aspirin reduces the risk of a first heart attack. The effect is largest in older adults. \
It also lowers the risk of stroke slightly. Some trials saw fewer colorectal cancers. Benefits take years \
to appear. Younger people gain little.

The evidence comes mostly from large randomized trials.

## Dosing
The usual dose is 75 to 100 mg a day. Higher doses add no benefit.

# Harms
Aspirin raises the risk of stomach bleeding. Bleeding risk grows with age.
"""
GUIDE_DOC = {
    "id": "guide",
    "title": "Aspirin guide",
    "content": GUIDE,
    "metadata": {"year": 2023, "topic": "cardiology"},
}
LEAVES = 19  # 13 sentences in GUIDE, 2 in each of the three DOCUMENTS
DOSE = "What daily dose of aspirin should be taken?"
# A Markdown API reference: many short lines under nested headings.
CLUSTER = """# Cluster

Clusters of processes can run multiple instances of a server that distribute workloads among their threads.

## How it works

The worker processes are spawned using the fork method. They communicate with the parent over a channel.

The primary process listens on a port. It accepts new connections and distributes them across the workers \
in a round-robin fashion.

## Class: Worker

A worker object contains all public information and methods about a worker.

### Event: 'disconnect'

Emitted after the worker channel has disconnected. **Default:** `false`.

### Event: 'exit'

* `code` {number} The exit code, if it exited normally.
* `signal` {string} The name of the signal that caused the process to be killed.

### worker.kill([signal])

* `signal` {string} Name of the kill signal to send to the worker process. **Default:** `'SIGTERM'`.

This function will kill the worker. In the primary worker, it does this by disconnecting the channel.

## cluster.settings

* `execArgv` {string\\[]} List of string arguments passed to the executable. **Default:** `process.execArgv`.
* `silent` {boolean} Whether or not to send output to parent's stdio. **Default:** `false`.
* `stdio` {Array} Configures the stdio of forked processes.

After calling `.setupPrimary()` this settings object will contain the settings, including the default values.
"""
CLUSTER_DOC = {"id": "cluster", "title": "Cluster", "content": CLUSTER}
INGRESS = "How do I configure an ingress controller in Kubernetes?"
STROKE = "Does aspirin lower the risk of stroke?"


def _ingest_guide(service: RagService) -> RagService:
    result = service.ingest({"collection_id": "docs", "documents": [GUIDE_DOC, *DOCUMENTS]})
    assert result["ingested_count"] == 4
    return service


@pytest.fixture
def node_service(service: RagService) -> RagService:
    return _ingest_guide(service)


@pytest.fixture
def any_node_service(any_service: RagService) -> RagService:
    """The guide and DOCUMENTS on each backend."""
    return _ingest_guide(any_service)


def noderag(
    service: RagService, query: str, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "query": query,
        "collection_id": "docs",
        "technique_params": params or {},
        "options": {"generate": False, **options},
    }
    return service.execute({"technique": "noderag", "arguments": arguments})


def top(result: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = result["retrieved_documents"][0]
    return document


def context_roles(document: dict[str, Any]) -> dict[str, str]:
    return {c["label"]: c["role"] for c in document["score_details"]["context_nodes"]}


def test_result_carries_node_path_context_and_a_chunk(any_node_service: RagService) -> None:
    result = noderag(any_node_service, DOSE, top_k=3)
    assert result["answer"] is None and result["metadata"]["answer_source"] == "none"
    first = top(result)
    details = first["score_details"]
    assert first["id"] == "guide" and first["title"] == "Aspirin guide"
    assert details["path"] == (
        "document 'Aspirin guide' > section 'Benefits' > section 'Dosing' > paragraph 1 > sentence 1"
    )
    assert [n["kind"] for n in details["node_path"]] == [
        "document",
        "section",
        "section",
        "paragraph",
        "sentence",
    ]
    best = details["node_path"][-1]
    assert first["chunk_id"] == f"guide#node-{best['node_id']}"
    assert GUIDE[best["start_char"] : best["end_char"]] == "The usual dose is 75 to 100 mg a day."
    assert details["matched_nodes"][0] == {"node_id": best["node_id"], "score": details["leaf_score"]}
    assert first["similarity_score"] == pytest.approx(details["leaf_score"])
    # Default context: both dosing sentences, the headings, and the Benefits section's key sentence.
    assert first["content"].startswith("Benefits > Dosing\n\n")
    assert "The usual dose is 75 to 100 mg a day. Higher doses add no benefit." in first["content"]
    roles = sorted(c["role"] for c in details["context_nodes"])
    assert "key_sentence" in roles and "match" in roles
    # The chunk: offsets span every context sentence; metadata and title come from the document.
    spans = [(c["start_char"], c["end_char"]) for c in details["context_nodes"]]
    metadata = first["metadata"]
    assert (metadata["start_char"], metadata["end_char"]) == (
        min(s for s, _ in spans),
        max(e for _, e in spans),
    )
    assert metadata["year"] == 2023 and metadata["topic"] == "cardiology"
    assert metadata["chunk_index"] == best["node_id"]
    specific = result["metadata"]["technique_specific"]
    assert specific["results"][0] == {
        "chunk_id": first["chunk_id"],
        "node_path": details["path"],
        "matched_node_ids": [m["node_id"] for m in details["matched_nodes"]],
        "context_node_ids": [c["node_id"] for c in details["context_nodes"]],
    }
    assert (specific["node_depth"], specific["context_window"], specific["aggregation_strategy"]) == (
        3,
        2,
        "concatenate",
    )
    assert result["performance"]["documents_searched"] == specific["leaf_nodes_searched"] == LEAVES


def test_sentences_of_one_paragraph_come_back_once(node_service: RagService) -> None:
    result = noderag(node_service, "aspirin heart attack stroke older adults", top_k=10)
    documents = result["retrieved_documents"]
    paragraphs = [(d["id"], d["score_details"]["node_path"][-2]["node_id"]) for d in documents]
    assert len(paragraphs) == len(set(paragraphs)), "one result per paragraph"
    benefits = next(d for d in documents if "The effect is largest in older adults." in d["content"])
    assert len(benefits["score_details"]["matched_nodes"]) >= 2, "several matched sentences, one result"
    assert result["metadata"]["technique_specific"]["merged_matches"] >= 1
    scores = [d["similarity_score"] for d in documents]
    assert scores == sorted(scores, reverse=True)


def test_context_window_takes_siblings_on_each_side(node_service: RagService) -> None:
    narrow = top(
        noderag(node_service, STROKE, {"context_window": 1, "include_parent_context": False}, top_k=1)
    )
    wide = top(noderag(node_service, STROKE, {"context_window": 3, "include_parent_context": False}, top_k=1))
    assert narrow["chunk_id"] == wide["chunk_id"]
    assert "It also lowers the risk of stroke slightly." in narrow["content"]

    def siblings(document: dict[str, Any]) -> list[int]:
        return [c["distance"] for c in document["score_details"]["context_nodes"] if c["role"] == "sibling"]

    assert siblings(narrow) and max(siblings(narrow)) == 1
    assert max(siblings(wide)) == 3 or len(siblings(wide)) > len(siblings(narrow))
    assert len(wide["content"]) > len(narrow["content"])
    assert "Younger people gain little." not in narrow["content"]
    assert "Daily low-dose aspirin" in wide["content"] and "Younger people gain little." in wide["content"]
    assert "The evidence comes" not in wide["content"], "the window stays inside the paragraph"


def test_node_depth_sets_how_far_parent_context_reaches(node_service: RagService) -> None:
    contents, reached = [], []
    for depth in (1, 2, 3, 4, 10):
        document = top(noderag(node_service, DOSE, {"node_depth": depth, "context_window": 1}, top_k=1))
        contents.append(document["content"])
        reached.append([a["kind"] for a in document["score_details"]["ancestors_reached"]])
    assert reached[:4] == [
        ["paragraph"],
        ["paragraph", "section"],
        ["paragraph", "section", "section"],
        ["paragraph", "section", "section", "document"],
    ]
    assert reached[4] == reached[3], "the tree ends at the document"
    assert not contents[0].startswith("Dosing") and "Benefits" not in contents[0]
    assert contents[1].startswith("Dosing\n\n")
    assert contents[2].startswith("Benefits > Dosing\n\n") and len(contents[2]) > len(contents[1])
    assert contents[4] == contents[3]


def test_parent_context_can_be_left_out(node_service: RagService) -> None:
    with_parents = top(noderag(node_service, DOSE, top_k=1))
    without = top(noderag(node_service, DOSE, {"include_parent_context": False}, top_k=1))
    assert without["content"] == "The usual dose is 75 to 100 mg a day. Higher doses add no benefit."
    assert "key_sentence" not in {c["role"] for c in without["score_details"]["context_nodes"]}
    assert without["score_details"]["ancestors_reached"] == []
    assert with_parents["content"] != without["content"]
    with pytest.raises(InvalidParametersError, match="node_depth"):
        noderag(node_service, DOSE, {"include_parent_context": False, "node_depth": 2})
    with pytest.raises(InvalidParametersError):
        noderag(node_service, DOSE, {"node_depth": 11})


def test_aggregation_strategies(node_service: RagService) -> None:
    params = {"context_window": 3, "include_parent_context": False}
    concatenate = top(noderag(node_service, STROKE, params, top_k=1))
    weighted = top(noderag(node_service, STROKE, {**params, "aggregation_strategy": "weighted"}, top_k=1))
    summarize = noderag(node_service, STROKE, {**params, "aggregation_strategy": "summarize"}, top_k=1)
    summary = top(summarize)

    # concatenate: the context verbatim, in document order.
    assert concatenate["content"] in GUIDE
    assert concatenate["similarity_score"] == pytest.approx(concatenate["score_details"]["leaf_score"])

    # weighted: one sentence a line, most relevant (weight x similarity) first; a blended score.
    nodes = weighted["score_details"]["context_nodes"]
    lines = weighted["content"].split("\n")
    assert sorted(lines) == sorted(GUIDE[n["start_char"] : n["end_char"]] for n in nodes)
    contribution = {GUIDE[n["start_char"] : n["end_char"]]: n["weight"] * n["similarity"] for n in nodes}
    assert [contribution[line] for line in lines] == sorted(contribution.values(), reverse=True)
    assert lines[0] == "It also lowers the risk of stroke slightly."
    assert all(n["weight"] == pytest.approx(0.5 ** n["distance"]) for n in nodes)
    leaf = weighted["score_details"]["leaf_score"]
    assert weighted["similarity_score"] < leaf, "the neighbours are less similar than the match"
    assert weighted["similarity_score"] == pytest.approx(weighted["score_details"]["score"], abs=1e-6)

    # summarize without an LLM: the two context sentences nearest the query, in document order.
    assert summarize["metadata"]["technique_specific"]["summary_source"] == "extractive"
    assert summary["score_details"]["summary_source"] == "extractive"
    summarized = summary["score_details"]["context_nodes"]
    similarity = {GUIDE[n["start_char"] : n["end_char"]]: n["similarity"] for n in summarized}
    best_two = sorted(similarity, key=lambda s: -similarity[s])[:2]
    assert sorted(best_two, key=GUIDE.index) == [s for s in similarity if s in summary["content"]]
    assert len(summary["content"]) < len(concatenate["content"])
    assert len({concatenate["content"], weighted["content"], summary["content"]}) == 3


def test_weighted_score_blends_the_match_with_its_neighbourhood(node_service: RagService) -> None:
    result = noderag(node_service, "aspirin", {"aggregation_strategy": "weighted"}, top_k=4)
    for document in result["retrieved_documents"]:
        details = document["score_details"]
        hood = details["neighbourhood"]
        assert {n["node_id"] for n in hood} <= {c["node_id"] for c in details["context_nodes"]}
        mean = sum(n["weight"] * n["similarity"] for n in hood) / sum(n["weight"] for n in hood)
        assert details["neighbourhood_mean"] == pytest.approx(mean, abs=1e-5)
        assert document["similarity_score"] == pytest.approx(
            0.8 * details["leaf_score"] + 0.2 * mean, abs=1e-5
        )
    scores = [d["similarity_score"] for d in result["retrieved_documents"]]
    assert scores == sorted(scores, reverse=True)


def test_weighted_ranks_a_focused_passage_above_an_isolated_sentence(service: RagService) -> None:
    isolated = (
        "Lava from the volcano destroyed three houses. My aunt collects old stamps. The bus was late again."
    )
    focused = (
        "Volcanic eruptions damage houses in many ways. Lava flows burn houses in their path. "
        "Falling volcanic ash collapses the roofs of houses. Volcanic mudflows bury houses and roads."
    )
    documents = [
        {"id": "isolated", "title": "Field notes", "content": isolated},
        {"id": "focused", "title": "Eruption hazards", "content": focused},
    ]
    service.ingest({"collection_id": "hazards", "documents": documents})

    def ranking(strategy: str) -> list[str]:
        arguments = {
            "query": "lava destroying homes",
            "collection_id": "hazards",
            "options": {"generate": False},
            "technique_params": {"aggregation_strategy": strategy},
        }
        result = service.execute({"technique": "noderag", "arguments": arguments})
        return [d["id"] for d in result["retrieved_documents"]]

    assert ranking("concatenate") == ["isolated", "focused"], "the single best sentence wins"
    assert ranking("weighted") == ["focused", "isolated"], (
        "its unrelated neighbours pull the isolated one down"
    )


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(reply="  Aspirin slightly lowers stroke risk.\n")
    yield server
    server.close()


def _llm_service(tmp_path: Path, embedder: Embedder, server: FakeOpenAIServer) -> RagService:
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "llm",
        LLM_PROVIDER="openai",
        LLM_MODEL="fake-model",
        LLM_API_KEY="sk-test",
        LLM_BASE_URL=server.base_url,
        LLM_MAX_RETRIES=0,
    )
    service = RagService(settings, embedder=embedder)
    service.ingest({"collection_id": "docs", "documents": [GUIDE_DOC, *DOCUMENTS]})
    return service


def test_summarize_uses_the_configured_llm(
    tmp_path: Path, embedder: Embedder, fake_llm: FakeOpenAIServer
) -> None:
    service = _llm_service(tmp_path, embedder, fake_llm)
    try:
        ingest_calls = len(fake_llm.requests)  # other techniques' indexes may call the LLM at ingest
        result = noderag(service, STROKE, {"aggregation_strategy": "summarize"}, top_k=2)
        assert result["metadata"]["technique_specific"]["summary_source"] == "llm"
        for document in result["retrieved_documents"]:
            assert document["content"] == "Aspirin slightly lowers stroke risk."
            assert document["score_details"]["summary_source"] == "llm"
        bodies = [r["body"] for r in fake_llm.requests[ingest_calls:]]
        assert len(bodies) == 2, "one summary per result, and no answer with generate=false"
        users = [b["messages"][1]["content"] for b in bodies]
        assert all(u.startswith(f"Question: {STROKE}\n\nDocument: ") for u in users)
        assert any("It also lowers the risk of stroke slightly." in u for u in users), "the excerpt is sent"
        assert "summary" in bodies[0]["messages"][0]["content"]
        assert bodies[0]["max_tokens"] == 200 and bodies[0]["model"] == "fake-model"

        fake_llm.status = 500
        failed = noderag(service, STROKE, {"aggregation_strategy": "summarize"}, top_k=1)
        specific = failed["metadata"]["technique_specific"]
        assert specific["summary_source"] == "extractive" and specific["llm_errors"]
        assert "stroke" in top(failed)["content"]
        assert top(failed)["score_details"]["llm_error"]
    finally:
        service.close()


def test_filters_apply_inside_retrieval(node_service: RagService) -> None:
    result = noderag(node_service, "aspirin heart attack", top_k=5, filters={"year": {"gte": 2020}})
    assert {d["id"] for d in result["retrieved_documents"]} <= {"guide", "volcano", "sourdough"}
    assert "aspirin" not in {d["id"] for d in result["retrieved_documents"]}
    specific = result["metadata"]["technique_specific"]
    assert specific["leaf_nodes_searched"] == LEAVES - 2, (
        "the aspirin document's two sentences are filtered out"
    )
    assert result["metadata"]["filters"]["matched_documents"] == 3
    only = noderag(node_service, "aspirin", top_k=5, filters={"topic": "food"})
    assert [d["id"] for d in only["retrieved_documents"]] == ["sourdough"]
    nothing = noderag(node_service, "aspirin", filters={"colour": "red"})
    assert nothing["retrieved_documents"] == []
    assert nothing["metadata"]["filters"]["unknown_fields"] == ["colour"]


def test_generate_writes_an_answer_from_the_contexts(node_service: RagService) -> None:
    result = noderag(node_service, DOSE, top_k=2, generate=True)
    assert result["metadata"]["answer_source"] == "extractive"
    assert "The usual dose is 75 to 100 mg a day. [1]" in result["answer"]
    evidence = noderag(node_service, DOSE, top_k=2)
    assert evidence["answer"] is None and evidence["retrieved_documents"]


def _chunk_cosines(service: RagService, query: str, document: dict[str, Any]) -> list[float]:
    """The query cosine of each stored chunk holding one of a result's matched sentences."""
    matched = [c for c in document["score_details"]["context_nodes"] if c["role"] == "match"]
    holders = [
        chunk.chunk_id
        for chunk in service.store.get_document_chunks("docs", document["id"])
        if any(chunk.start_char < m["end_char"] and m["start_char"] < chunk.end_char for m in matched)
    ]
    vector = service.embedder.encode_query(query)
    return list(service.store.vector_scores("docs", vector, holders).values())


def test_min_similarity_and_the_relevance_floor_read_the_chunk_cosine(node_service: RagService) -> None:
    """A result's chunk id names a node, not a stored chunk: its query cosine is the best of the stored
    chunks holding its matched sentences, the scale every technique is judged on."""
    ranked = noderag(node_service, DOSE, top_k=10, generate=True)  # the other documents too
    documents = ranked["retrieved_documents"]
    chunk_scores = [max(_chunk_cosines(node_service, DOSE, d)) for d in documents]
    assert ranked["metadata"]["relevance"]["best_query_similarity"] == pytest.approx(
        max(chunk_scores), abs=1e-5
    )
    assert max(chunk_scores) < max(d["score_details"]["leaf_score"] for d in documents)
    threshold = (max(chunk_scores) + min(chunk_scores)) / 2
    kept = noderag(node_service, DOSE, top_k=10, min_similarity=threshold)["retrieved_documents"]
    assert 0 < len(kept) < len(documents)
    assert all(max(_chunk_cosines(node_service, DOSE, d)) >= threshold for d in kept)
    assert noderag(node_service, DOSE, min_similarity=0.99)["retrieved_documents"] == []
    off_topic = noderag(node_service, "Which football club won the league in 1987?", generate=True)
    assert off_topic["metadata"]["relevance"]["best_query_similarity"] < 0.25
    assert str(off_topic["answer"]).startswith("Nothing relevant was found")


def test_an_off_topic_question_on_a_markdown_reference_is_refused_as_rag_basic_refuses_it(
    service: RagService,
) -> None:
    """Its short sentences ('title > headings' and a line) scored 0.30 for a Kubernetes question that
    rag_basic's chunks score 0.16: on the sentence scale NodeRAG quoted unrelated lines as the answer."""
    service.ingest({"collection_id": "docs", "documents": [CLUSTER_DOC]})
    answers = {}
    for technique in ("basic", "noderag"):
        arguments = {"query": INGRESS, "collection_id": "docs"}
        answers[technique] = service.execute({"technique": technique, "arguments": arguments})
    basic, node = (answers[t]["metadata"]["relevance"]["best_query_similarity"] for t in ("basic", "noderag"))
    assert basic < 0.25
    assert node <= basic + 1e-6, "NodeRAG's chunks are among those rag_basic searched"
    assert str(answers["noderag"]["answer"]).startswith("Nothing relevant was found")


def test_index_follows_replace_and_delete_in_retrieval(any_node_service: RagService) -> None:
    assert top(noderag(any_node_service, "why does sourdough rise", top_k=1))["id"] == "sourdough"
    any_node_service.ingest(
        {
            "collection_id": "docs",
            "documents": [{"id": "sourdough", "content": "Rye crackers are baked flat and dry."}],
        }
    )
    replaced = noderag(any_node_service, "rye crackers", top_k=1)
    assert (
        top(replaced)["id"] == "sourdough"
        and top(replaced)["content"] == "Rye crackers are baked flat and dry."
    )
    assert any_node_service.store.delete_document("docs", "sourdough")
    after = noderag(any_node_service, "rye crackers", top_k=5)
    assert "sourdough" not in {d["id"] for d in after["retrieved_documents"]}
    assert after["metadata"]["technique_specific"]["leaf_nodes_searched"] == LEAVES - 2


def test_collection_ingested_before_the_index_needs_a_reindex(settings: Settings, embedder: Embedder) -> None:
    store = SqliteStore(settings.database_path)
    Ingestor(settings, store, embedder).ingest(
        "old", [SourceDocument("a", "Lava flows. Ash falls.", "Volcano")]
    )
    store.close()
    service = RagService(settings, embedder=embedder)
    try:
        arguments = {"query": "lava", "collection_id": "old"}
        with pytest.raises(IndexNotBuiltError) as error:
            service.execute({"technique": "noderag", "arguments": arguments})
        assert error.value.code == "INDEX_NOT_BUILT"
        assert error.value.details == {"indexed": 0, "documents": 1}
        assert "noderag" in service.stale_indexes("old")
        service.reindex("old")
        result = service.execute({"technique": "noderag", "arguments": arguments})
        assert top(result)["chunk_id"] == "a#node-3" and top(result)["content"] == "Lava flows. Ash falls."
    finally:
        service.close()

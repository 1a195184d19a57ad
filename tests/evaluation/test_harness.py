"""Chunk rankings to document rankings, and `iris-rag eval` end to end with the real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.cli import build_parser, cmd_eval, main
from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError, PipelineNotFoundError
from iris_rag.evaluation.collection import collection_name
from iris_rag.evaluation.harness import document_ranking, rank
from iris_rag.ingestion.background import IndexBuilder
from iris_rag.pipeline import NoParams, Pipeline, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import CollectionInfo, StoredChunk
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
from iris_rag.techniques.noderag.storage import NodeTreeStorage
from tests.conftest import DOCUMENTS
from tests.evaluation.conftest import write_beir


def hit(document_id: str, index: int, score: float) -> RetrievedDocument:
    return RetrievedDocument(StoredChunk(f"{document_id}#{index}", document_id, index, "", 0, 0), score)


def test_each_document_ranks_at_its_best_chunk() -> None:
    hits = [hit("a", 0, 0.9), hit("b", 0, 0.8), hit("a", 1, 0.7), hit("c", 2, 0.6), hit("b", 1, 0.5)]
    assert document_ranking(hits, 10) == ["a", "b", "c"]
    assert document_ranking(hits, 2) == ["a", "b"]


def test_the_query_id_is_never_a_result() -> None:
    hits = [hit("q1", 0, 0.99), hit("a", 0, 0.9), hit("q1", 1, 0.8), hit("b", 0, 0.7)]
    assert document_ranking(hits, 2, exclude="q1") == ["a", "b"]


class _ManyChunksFirst(Pipeline):
    """Eight chunks of one document rank above everything else."""

    technique = "stub"
    asked: list[int]

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: Any
    ) -> Retrieval:
        self.asked.append(options.top_k)
        hits = [hit("a", i, 1.0 - i / 100) for i in range(8)] + [hit("b", 0, 0.5), hit("c", 0, 0.4)]
        return Retrieval(hits[: options.top_k], len(hits))


def test_rank_asks_deeper_until_k_documents_come_back(service: RagService) -> None:
    pipeline = _ManyChunksFirst(service.pipelines["basic"].context)
    pipeline.asked = []
    collection = CollectionInfo("stub", "model", 3, document_count=3, chunk_count=10)
    # k=2 asks 3 * 2 = 6 chunks (all of 'a'), then 10 (every chunk): 'b' comes back.
    assert rank(pipeline, collection, "query", "q", 2, NoParams()) == ["a", "b"]
    assert pipeline.asked == [6, 10]
    pipeline.asked = []
    # k=100 asks far beyond the public top_k cap of 50 (capped at the collection's chunk count).
    assert rank(pipeline, collection, "query", "q", 100, NoParams()) == ["a", "b", "c"]
    assert pipeline.asked == [10]


def test_collection_names() -> None:
    assert collection_name("scifact", 1000, 150) == "eval-scifact"
    assert collection_name("scifact", 20000, 150) == "eval-scifact-c20000"
    assert collection_name("my data/set", 500, 100) == "eval-my-data-set-c500-o100"
    assert len(collection_name("x" * 100, 20000, 150)) == 64


QUERIES = {
    "q-aspirin": "Does aspirin prevent heart attacks?",
    "q-volcano": "how does lava flow from a volcano",
    "q-bread": "why does sourdough bread rise",
}
QRELS = [("q-aspirin", "aspirin", 1), ("q-volcano", "volcano", 1), ("q-bread", "sourdough", 1)]


@pytest.fixture
def obvious(tmp_path: Path) -> Path:
    """Three unrelated documents and one query each whose answer is unmistakable."""
    corpus = [{"_id": str(d["id"]), "title": str(d["title"]), "text": str(d["content"])} for d in DOCUMENTS]
    return write_beir(tmp_path / "obvious", corpus, QUERIES, QRELS)


def eval_args(dataset: Path, *extra: str) -> Any:
    return build_parser().parse_args(["eval", "--dataset", str(dataset), *extra])


def test_eval_basic_end_to_end_then_reuses_the_collection(
    service: RagService, obvious: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    assert cmd_eval(eval_args(obvious, "--techniques", "basic", "--out", str(out)), service) == 0

    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == [
        "technique",
        "nDCG@10",
        "R@10",
        "R@100",
        "MRR@10",
        "p50",
        "ms",
        "p95",
        "ms",
    ]
    assert table.splitlines()[2].split()[:5] == ["basic", "1.0000", "1.0000", "1.0000", "1.0000"]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert {"dataset": "obvious", "documents": 3, "queries": 3}.items() <= report.items()
    assert list(report["techniques"]) == ["basic"]
    basic = report["techniques"]["basic"]
    assert set(basic) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "latency_ms"}
    assert [basic[m] for m in ("ndcg@10", "recall@10", "recall@100", "mrr@10")] == [1.0, 1.0, 1.0, 1.0]
    assert set(basic["latency_ms"]) == {"p50", "p95"}
    assert 0 < basic["latency_ms"]["p50"] <= basic["latency_ms"]["p95"]
    assert (report["collection"], report["documents_ingested"], report["split"]) == (
        "eval-obvious",
        3,
        "test",
    )
    stored = service.store.get_document("eval-obvious", "volcano")
    assert stored is not None

    # The second run finds every corpus id stored: nothing is ingested or re-embedded.
    def no_ingest(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the collection should have been reused")

    ingest = service.ingestor.ingest
    service.ingestor.ingest = no_ingest  # type: ignore[method-assign,assignment]
    assert cmd_eval(eval_args(obvious, "--out", str(out)), service) == 0
    again = json.loads(out.read_text(encoding="utf-8"))
    assert again["techniques"]["basic"]["ndcg@10"] == 1.0
    assert again["documents_ingested"] == 0
    assert service.store.get_document("eval-obvious", "volcano") == stored

    # A document lost since (an interrupted ingest, say) is ingested alone.
    service.ingestor.ingest = ingest  # type: ignore[method-assign]
    assert service.store.delete_document("eval-obvious", "volcano")
    assert cmd_eval(eval_args(obvious, "--out", str(out)), service) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["documents_ingested"] == 1


def test_a_corpus_document_edited_since_is_ingested_again(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Scores must come from the corpus as it is now, not as it was at the first run."""
    corpus = [
        {"_id": "c1", "title": "Kudu", "text": "The greater kudu is a woodland antelope with spiral horns."},
        {
            "_id": "c2",
            "title": "Aspirin",
            "text": "Daily aspirin reduces the risk of heart attacks in adults.",
        },
        {"_id": "c3", "title": "Bread", "text": "Sourdough bread rises because of wild yeast."},
    ]
    queries = {"q1": "Which antelope has spiral horns?"}
    dataset = write_beir(tmp_path / "ds", corpus, queries, [("q1", "c1", 1)])
    out = tmp_path / "report.json"
    assert cmd_eval(eval_args(dataset, "--out", str(out)), service) == 0
    capsys.readouterr()

    # The antelope text moves to c2; c1 is now about sharks; c3 keeps its text.
    corpus[0] = {"_id": "c1", "title": "Sharks", "text": "Great white sharks hunt seals near the coast."}
    corpus[1] = {
        "_id": "c2",
        "title": "Kudu",
        "text": "The greater kudu is a woodland antelope with spiral horns.",
    }
    write_beir(dataset, corpus, queries, [("q1", "c2", 1)])
    assert cmd_eval(eval_args(dataset, "--out", str(out)), service) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["documents_ingested"] == 2
    assert report["techniques"]["basic"]["ndcg@10"] == 1.0
    assert "eval: 2 corpus documents changed since eval-ds was ingested; ingesting them again" in (
        capsys.readouterr().err
    )
    stored = service.store.get_document("eval-ds", "c1")
    assert stored is not None and (stored.title, stored.content) == (corpus[0]["title"], corpus[0]["text"])


def test_a_collection_with_foreign_documents_is_refused(service: RagService, obvious: Path) -> None:
    service.ingest({"collection_id": "eval-obvious", "documents": [{"id": "stray", "content": "Not in it."}]})
    with pytest.raises(InvalidParametersError, match="1 documents that are not in the corpus"):
        cmd_eval(eval_args(obvious), service)


def test_unknown_technique_fails_before_any_work(service: RagService, obvious: Path) -> None:
    with pytest.raises(PipelineNotFoundError, match="valid: basic"):
        cmd_eval(eval_args(obvious, "--techniques", "basic,no_such_technique"), service)
    with pytest.raises(InvalidParametersError, match="invalid parameters for basic"):
        cmd_eval(eval_args(obvious, "--params", 'basic={"alpha": 1}'), service)
    with pytest.raises(
        InvalidParametersError, match="--params names 'hybrid_ifind', which --techniques does not"
    ):
        cmd_eval(eval_args(obvious, "--techniques", "basic", "--params", 'hybrid_ifind={"nope": 1}'), service)
    assert service.store.get_collection("eval-obvious") is None


def test_an_index_missing_from_the_collection_is_built_before_its_technique_runs(
    settings: Settings, embedder: Embedder, obvious: Path, tmp_path: Path
) -> None:
    narrow = RagService(settings.model_copy(update={"techniques": "basic"}), embedder=embedder)
    try:
        assert cmd_eval(eval_args(obvious, "--techniques", "basic"), narrow) == 0
    finally:
        narrow.close()
    full = RagService(settings, embedder=embedder)
    try:
        assert "colbert" in full.stale_indexes("eval-obvious")
        out = tmp_path / "colbert.json"
        assert cmd_eval(eval_args(obvious, "--techniques", "colbert", "--out", str(out)), full) == 0
        assert full.stale_indexes("eval-obvious") == []
        assert json.loads(out.read_text(encoding="utf-8"))["techniques"]["colbert"]["ndcg@10"] == 1.0
    finally:
        full.close()


def test_eval_builds_only_the_indexes_of_the_techniques_it_scores(
    obvious: Path, tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--techniques keyword` on a large corpus must not wait for GraphRAG's, NodeRAG's, ColBERT's builds."""
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("RAG_TECHNIQUES", raising=False)
    monkeypatch.setenv("INDEX_BUILD", "background")  # the default: the builder fills what an index lacks
    monkeypatch.setattr("iris_rag.service.create_encoder", lambda _settings: embedder)

    def indexed() -> list[int]:
        store = SqliteStore(tmp_path / "data" / "iris_rag.sqlite3")
        try:
            return [
                store.technique_storage(KnowledgeGraphStorage).indexed_documents("eval-obvious"),
                store.technique_storage(NodeTreeStorage).indexed_documents("eval-obvious"),
                store.technique_storage(TokenVectorStorage).indexed_documents("eval-obvious"),
            ]
        finally:
            store.close()

    assert main(["eval", "--dataset", str(obvious), "--techniques", "keyword,basic"]) == 0
    assert indexed() == [0, 0, 0]
    # A later eval of a technique with an index builds it for the documents already there.
    assert (
        main(["eval", "--dataset", str(obvious), "--techniques", "graphrag", "--out", str(tmp_path / "r")])
        == 0
    )
    assert indexed() == [3, 0, 0]
    assert json.loads((tmp_path / "r").read_text(encoding="utf-8"))["documents_ingested"] == 0


def test_after_eval_other_commands_start_no_build_and_report_the_indexes_incomplete(
    obvious: Path,
    tmp_path: Path,
    embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A short CLI process must not start builds it abandons at exit (torch loaded for nothing, noise).

    `eval --techniques basic` leaves the other indexes unbuilt; nothing builds them until a reindex (or
    the MCP worker, or an eval that scores them), and health says so: incomplete, not building for good.
    """
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("RAG_TECHNIQUES", raising=False)
    monkeypatch.setenv("INDEX_BUILD", "background")
    monkeypatch.setattr("iris_rag.service.create_encoder", lambda _settings: embedder)
    scanned: list[str] = []
    missing_documents = IndexBuilder.missing_documents

    def spy(builder: IndexBuilder, collection_id: str) -> list[str]:
        scanned.append(collection_id)
        return missing_documents(builder, collection_id)

    monkeypatch.setattr(IndexBuilder, "missing_documents", spy)
    assert main(["eval", "--dataset", str(obvious), "--techniques", "basic"]) == 0
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"_id": "n1", "text": "Kudus are antelopes with spiral horns."}\n', encoding="utf-8")
    scanned.clear()
    # A command that writes builds (and waits for) the indexes of its own collection only.
    assert main(["ingest", str(notes), "--collection", "notes"]) == 0
    assert set(scanned) <= {"notes"}
    scanned.clear()
    assert main(["query", "lava", "--collection", "eval-obvious", "--no-generate"]) == 0
    assert main(["documents", "--collection", "eval-obvious"]) == 0
    capsys.readouterr()
    assert main(["health"]) == 0
    assert scanned == []
    collections = orjson.loads(capsys.readouterr().out)["components"]["vector_store"]["details"][
        "index_build"
    ]["collections"]
    assert {t: s["state"] for t, s in collections["eval-obvious"].items()} == {
        "colbert": "incomplete",
        "graphrag": "incomplete",
        "noderag": "incomplete",
    }
    assert {s["state"] for s in collections["notes"].values()} == {"ready"}

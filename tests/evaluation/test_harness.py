"""Chunk rankings to document rankings, and `iris-rag eval` end to end with the real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytrec_eval

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


def test_a_corpus_id_on_two_lines_gives_the_same_result_on_every_run(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last line of an id is the document (as BEIR's loader), so a re-run finds nothing changed."""
    corpus = [
        {"_id": "d1", "title": "", "text": "Aspirin lowers fever in adults."},
        {"_id": "d2", "title": "", "text": "Statins lower LDL cholesterol in the blood."},
        {"_id": "d3", "title": "", "text": "Exercise improves sleep quality."},
        {"_id": "d2", "title": "", "text": "Bananas are a yellow tropical fruit."},
    ]
    dataset = write_beir(tmp_path / "dup", corpus, {"q1": "what lowers cholesterol"}, [("q1", "d2", 1)])
    out = tmp_path / "report.json"
    reports = []
    for _ in range(2):
        assert cmd_eval(eval_args(dataset, "--out", str(out)), service) == 0
        reports.append(json.loads(out.read_text(encoding="utf-8")))
        assert (
            "eval: 1 corpus ids are on more than one line (d2); the last line of each"
            in capsys.readouterr().err
        )
    assert [(r["documents"], r["documents_ingested"], r["duplicate_corpus_ids"]) for r in reports] == [
        (3, 3, 1),
        (3, 0, 1),
    ]
    assert reports[0]["techniques"]["basic"]["ndcg@10"] == reports[1]["techniques"]["basic"]["ndcg@10"]
    stored = service.store.get_document("eval-dup", "d2")
    assert stored is not None and stored.content == "Bananas are a yellow tropical fruit."


def test_a_collection_chunked_otherwise_is_refused_not_reported_as_rechunked(
    service: RagService, obvious: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    mine = ("--collection", "mine", "--out", str(out))
    assert cmd_eval(eval_args(obvious, "--chunk-size", "1000", *mine), service) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert (report["chunk_size"], report["chunk_overlap"]) == (1000, 150)
    with pytest.raises(
        InvalidParametersError,
        match=r"'mine' was chunked with chunk_size 1000, chunk_overlap 150, not the 200, 150 asked for",
    ):
        cmd_eval(eval_args(obvious, "--chunk-size", "200", *mine), service)
    # The same chunking reuses it.
    assert cmd_eval(eval_args(obvious, "--chunk-size", "1000", *mine), service) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["documents_ingested"] == 0


def test_a_collection_eval_did_not_ingest_reports_its_chunking_unknown(
    service: RagService, obvious: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    documents = [
        {"id": str(d["id"]), "title": str(d["title"]), "content": str(d["content"])} for d in DOCUMENTS
    ]
    service.ingest({"collection_id": "mine", "documents": documents})
    out = tmp_path / "report.json"
    assert cmd_eval(eval_args(obvious, "--collection", "mine", "--out", str(out)), service) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert (report["documents_ingested"], report["chunk_size"], report["chunk_overlap"]) == (0, None, None)
    assert "eval: 3 documents of mine carry no record of their chunking" in (capsys.readouterr().err)


def test_a_ranking_shallower_than_the_deepest_cutoff_is_refused(service: RagService, obvious: Path) -> None:
    with pytest.raises(InvalidParametersError, match="--k must be at least 100: Recall@100 needs"):
        cmd_eval(eval_args(obvious, "--k", "10"), service)
    assert service.store.get_collection("eval-obvious") is None


def test_an_unwritable_report_or_runs_folder_is_refused_before_the_run(
    service: RagService, obvious: Path, tmp_path: Path
) -> None:
    """--out or --runs under a file failed with a traceback after the whole run; now before it, one line."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    for option in (("--out", str(blocker / "report.json")), ("--runs", str(blocker / "runs"))):
        with pytest.raises(InvalidParametersError, match=f"cannot write to {blocker}"):
            cmd_eval(eval_args(obvious, *option), service)
    assert service.store.get_collection("eval-obvious") is None


def test_the_run_files_recompute_every_figure_of_the_report(
    service: RagService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--runs: trec_eval's formats, from which pytrec_eval gives back the report's figures."""
    corpus = [{"_id": str(d["id"]), "title": str(d["title"]), "text": str(d["content"])} for d in DOCUMENTS]
    queries = {**QUERIES, "q-miss": "sourdough volcano aspirin", "q-none": "what is lava"}
    qrels = [*QRELS, ("q-miss", "volcano", 1), ("q-miss", "aspirin", 2), ("q-none", "volcano", 0)]
    dataset = write_beir(tmp_path / "ds", corpus, queries, qrels)
    out, runs = tmp_path / "report.json", tmp_path / "runs"
    args = eval_args(dataset, "--techniques", "basic,keyword", "--out", str(out), "--runs", str(runs))
    assert cmd_eval(args, service) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["command"].endswith(f"--runs {runs}")
    assert sorted(p.name for p in runs.iterdir()) == ["basic.run", "keyword.run", "qrels.txt"]
    first = (runs / "basic.run").read_text(encoding="utf-8").splitlines()[0].split()
    assert (first[1], first[3], first[5]) == ("Q0", "1", "basic")
    with (runs / "qrels.txt").open(encoding="utf-8") as handle:
        judged = pytrec_eval.parse_qrel(handle)
    assert len(judged) == report["queries"] == 5
    for technique, figures in report["techniques"].items():
        with (runs / f"{technique}.run").open(encoding="utf-8") as handle:
            run = pytrec_eval.parse_run(handle)
        full = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.10", "recall.100"}).evaluate(
            run
        )
        top10 = {q: dict(sorted(docs.items(), key=lambda item: -item[1])[:10]) for q, docs in run.items()}
        mrr = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top10)
        recomputed = {
            "ndcg@10": sum(s["ndcg_cut_10"] for s in full.values()) / len(judged),
            "recall@10": sum(s["recall_10"] for s in full.values()) / len(judged),
            "recall@100": sum(s["recall_100"] for s in full.values()) / len(judged),
            "mrr@10": sum(s["recip_rank"] for s in mrr.values()) / len(judged),
        }
        assert {key: round(value, 5) for key, value in recomputed.items()} == {
            key: figures[key] for key in recomputed
        }
    assert 0 < report["techniques"]["basic"]["ndcg@10"] < 1

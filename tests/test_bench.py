"""The benchmarks measure what docs/benchmarks.md says they measure: the whole work, on the encoder the
settings name, on a collection that has the index the bench judges."""

import functools
import json
import sys
from pathlib import Path

import pytest

from bench import bench_large_document, bench_relevance_floor
from bench.common import SAMPLE, local_embedder
from iris_rag.embedder import Embedder
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS


def test_a_bench_encodes_on_the_backend_and_device_the_settings_name() -> None:
    """EMBEDDING_BACKEND=torch measured ONNX: the benches built Embedder(model) without the settings."""
    embedder = local_embedder(Settings(EMBEDDING_BACKEND="torch", EMBEDDING_BATCH_SIZE=8))
    try:
        assert (embedder.backend_setting, embedder.device, embedder.batch_size) == ("torch", "cpu", 8)
    finally:
        embedder.close()


def test_the_large_document_bench_times_the_index_builds_too(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under INDEX_BUILD=background the clock stopped when the core committed, the indexes unbuilt."""
    monkeypatch.setattr(bench_large_document, "local_embedder", lambda _settings: embedder)
    left_at_close: list[bool] = []
    close = RagService.close

    def closing(service: RagService) -> None:
        assert service.index_builder is not None
        left_at_close.append(service.index_builder.pending("large"))
        close(service)

    monkeypatch.setattr(RagService, "close", closing)
    out = tmp_path / "large.json"
    argv = ["bench_large_document", "--kb", "3", "--corpus", str(SAMPLE / "corpus.jsonl")]
    argv += ["--techniques", "basic,noderag", "--index-build", "background", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    bench_large_document.main()
    result = json.loads(out.read_text(encoding="utf-8"))
    assert left_at_close == [False]
    assert result["index_build"] == "background"
    assert result["technique_indexes"] == ["node_tree"]
    assert result["wall_s"] >= result["returned_wall_s"]


def test_the_relevance_floor_bench_builds_the_index_of_the_technique_it_judges(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--technique noderag` on a collection ingested without NodeRAG failed with KeyError 'relevance'."""
    data = tmp_path / "data"
    core = RagService(Settings(RAG_DATA_DIR=data, RAG_TECHNIQUES="basic"), embedder=embedder)
    documents = [SourceDocument(str(d["id"]), str(d["content"]), str(d["title"]), {}) for d in DOCUMENTS]
    core.ingestor.ingest("docs", documents)
    core.close()
    scifact = tmp_path / "scifact"
    (scifact / "qrels").mkdir(parents=True)
    (scifact / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\tnowhere\t1\n", encoding="utf-8"
    )
    query = {"_id": "q1", "text": "Why does sourdough bread rise?"}
    (scifact / "queries_train.jsonl").write_text(json.dumps(query) + "\n", encoding="utf-8")
    monkeypatch.setattr(bench_relevance_floor, "RagService", functools.partial(RagService, embedder=embedder))
    out = tmp_path / "floor.json"
    argv = [
        "bench_relevance_floor",
        "--data-dir",
        str(data),
        "--collection",
        "docs",
        "--scifact",
        str(scifact),
    ]
    monkeypatch.setattr(sys, "argv", [*argv, "--technique", "noderag", "--out", str(out)])
    bench_relevance_floor.main()
    groups = json.loads(out.read_text(encoding="utf-8"))["groups"]
    assert groups["topical"]["n"] == 1
    assert groups["topical"]["p50"] > 0.25  # the sourdough document answers it

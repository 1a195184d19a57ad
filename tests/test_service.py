"""Ingestion and the collection tools through the service (what the worker calls)."""

import json
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from iris_rag.access import Principal, principal_scope
from iris_rag.embedder import Embedder
from iris_rag.errors import DocumentNotFoundError, InvalidParametersError
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.worker.dispatch import Dispatcher
from tests.conftest import DOCUMENTS, ask
from tests.fake_openai import FakeOpenAIServer


def test_one_bad_document_does_not_stop_the_others(service: RagService) -> None:
    result = service.ingest(
        {
            "collection_id": "mixed",
            "documents": [
                {"id": "good", "content": "A perfectly good document about tides."},
                {"id": "empty", "content": "   "},
                {"id": "good", "content": "The same id again in one call."},
                {"id": "", "content": "No id."},
                {"content": "No id given, so one is derived from the content."},
            ],
        }
    )
    assert result["ingested_count"] == 2
    assert result["document_ids"][0] == "good"
    assert result["document_ids"][1].startswith("doc-")
    assert [(e["index"], e["code"]) for e in result["errors"]] == [
        (1, "INVALID_DOCUMENT"),
        (2, "DUPLICATE_DOCUMENT_ID"),
        (3, "INVALID_DOCUMENT"),
    ]
    stored = service.get_document({"document_id": "good", "collection_id": "mixed"})
    assert stored["content"] == "A perfectly good document about tides."


def test_reingest_replaces_and_is_searchable_at_once(loaded_service: RagService) -> None:
    loaded_service.ingest(
        {
            "collection_id": "docs",
            "documents": [{"id": "volcano", "content": "Glaciers carve U-shaped valleys."}],
        }
    )
    listed = loaded_service.list_collections({})["collections"]
    assert [(c["id"], c["document_count"], c["chunk_count"]) for c in listed] == [("docs", 3, 3)]
    top = ask(loaded_service, "glacier valleys", options={"top_k": 1})["retrieved_documents"]
    assert top[0]["id"] == "volcano"
    assert "Glaciers" in top[0]["content"]


def test_get_document_with_chunks_and_unknown_ids(loaded_service: RagService) -> None:
    document = loaded_service.get_document(
        {"document_id": "aspirin", "collection_id": "docs", "include_chunks": True}
    )
    assert document["title"] == DOCUMENTS[0]["title"]
    assert document["metadata"] == DOCUMENTS[0]["metadata"]
    assert document["chunks"][0]["chunk_id"] == "aspirin#0"
    with pytest.raises(DocumentNotFoundError):
        loaded_service.get_document({"document_id": "missing", "collection_id": "docs"})


def test_health_reports_every_component(loaded_service: RagService) -> None:
    health = loaded_service.health_check({"include_details": True})
    assert health["status"] == "healthy"
    assert set(health["components"]) == {
        "database",
        "python_bridge",
        "embedding_service",
        "llm_service",
        "vector_store",
    }
    assert health["components"]["embedding_service"]["details"]["dimension"] == 384
    assert health["components"]["vector_store"]["details"]["chunks"] == 3
    assert "details" not in loaded_service.health_check({})["components"]["database"]


def test_health_reports_the_last_hours_performance(loaded_service: RagService) -> None:
    loaded_service.monitor.record("rag_basic", "basic", 10.0, True, None)
    loaded_service.monitor.record("rag_basic", "basic", 30.0, True, None)
    loaded_service.monitor.record("rag_hyde", "hyde", 20.0, False, "TIMEOUT_EXCEEDED")
    performance = loaded_service.health_check({})["performance"]
    assert performance["window"] == "1h" and performance["request_count"] == 3
    assert performance["avg_response_time_ms"] == pytest.approx(20.0)
    assert performance["error_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert performance["requests_per_minute"] == pytest.approx(3 / 60, abs=1e-3)


def test_reindex_rebuilds_without_re_embedding(loaded_service: RagService) -> None:
    summary = loaded_service.reindex("docs")
    assert summary["documents"] == 3
    assert summary["embeddings_reused"] == summary["chunks"] == 3
    assert loaded_service.stale_indexes("docs") == []
    assert ask(loaded_service, "lava")["retrieved_documents"][0]["id"] == "volcano"


def test_reindex_leaves_the_documents_dates_as_they_were(loaded_service: RagService) -> None:
    """Nothing about a document changes in a reindex, so rag_list_documents must not report an edit."""
    before = loaded_service.list_documents({"collection_id": "docs"})["documents"]
    time.sleep(0.01)  # the stores' timestamps have millisecond resolution
    loaded_service.reindex("docs")
    assert loaded_service.list_documents({"collection_id": "docs"})["documents"] == before


def test_rag_techniques_limits_tools_and_ingest_indexes(settings: Settings, embedder: Embedder) -> None:
    every = RagService(settings, embedder=embedder)
    try:
        assert {"colbert", "noderag", "graphrag"} <= set(every.pipelines)
        every_indexes = len(every.ingestor.technique_indexes)
    finally:
        every.close()
    narrow = RagService(settings.model_copy(update={"techniques": "basic, hybrid_ifind"}), embedder=embedder)
    try:
        assert set(narrow.pipelines) == {"basic", "hybrid_ifind"}
        assert {t["name"] for t in narrow.describe()["tools"]} >= {"rag_basic", "rag_hybrid_ifind"}
        assert "rag_colbert" not in {t["name"] for t in narrow.describe()["tools"]}
        assert len(narrow.ingestor.technique_indexes) < every_indexes
    finally:
        narrow.close()
    with pytest.raises(ValueError, match="unknown techniques \\['colbret'\\]"):
        RagService(settings.model_copy(update={"techniques": "basic,colbret"}), embedder=embedder)


def test_llm_health_is_probed_cached_and_redacted(tmp_path: Path, embedder: Embedder) -> None:
    """Issue 11, defect 13: llm_service follows the LLM server (up, erroring, down), probed once per 30 s."""
    fake = FakeOpenAIServer()
    base_url = fake.base_url.replace("http://", "http://alice:s3cret-pass@")
    settings = Settings(
        RAG_DATA_DIR=tmp_path, LLM_PROVIDER="openai", LLM_BASE_URL=base_url, LLM_API_KEY="sk-health-key"
    )
    service = RagService(settings, embedder=embedder)
    try:
        llm = service.health_check({"include_details": True})["components"]["llm_service"]
        assert llm["status"] == "healthy" and llm["details"]["probed"] is True
        assert llm["details"]["http_status"] == 200
        service.health_check({})
        probes = [r for r in fake.requests if r["path"] == "/v1/models"]
        assert len(probes) == 1, "a second health check within the cache time probed again"

        fake.status = 503
        service._llm_probe.cache_s = 0  # the next check probes again (instead of waiting 30 s)
        erroring = service.health_check({"include_details": True})
        assert erroring["components"]["llm_service"]["status"] == "degraded"
        assert "HTTP 503" in erroring["components"]["llm_service"]["error_message"]
        assert erroring["status"] == "degraded"

        fake.close()
        down = service.health_check({"include_details": True})
        component = down["components"]["llm_service"]
        assert component["status"] == "unhealthy" and down["status"] == "unhealthy"
        assert "unreachable" in component["error_message"]
        text = json.dumps(down)
        assert "s3cret-pass" not in text and "alice" not in text and "sk-health-key" not in text
        assert "***@127.0.0.1" in component["details"]["base_url"]
    finally:
        service.close()
        fake.close()


def test_llm_health_without_an_llm_is_healthy_and_probes_nothing(service: RagService) -> None:
    llm = service.health_check({"include_details": True})["components"]["llm_service"]
    assert llm["status"] == "healthy" and llm["details"]["probed"] is False
    assert llm["error_message"] is None


def test_a_tool_is_listed_exactly_when_a_handler_serves_it(service: RagService) -> None:
    """The tool table (schemas) and the handler table (service.methods) name the same bridge methods."""
    from iris_rag.schemas import served_tool_specs

    listed = served_tool_specs(service.pipelines)
    methods = {spec["bridge"]["method"] for spec in listed}
    assert methods == set(service.methods()), "every listed tool has a handler, every handler a tool"
    techniques = {spec["bridge"]["technique"] for spec in listed if "technique" in spec["bridge"]}
    assert techniques == set(service.pipelines)
    assert {spec["name"] for spec in service.describe()["tools"]} == {spec["name"] for spec in listed}


def test_rag_metrics_names_an_unknown_technique_filter_and_takes_tool_names(
    loaded_service: RagService,
) -> None:
    arguments = {"query": "aspirin", "collection_id": "docs"}
    assert Dispatcher(loaded_service).call("execute", {"technique": "basic", "arguments": arguments})[0]
    loaded_service.monitor.flush()
    for name in ("basic", "rag_basic", ["rag_basic", "crag"]):
        metrics = loaded_service.metrics({"technique_filter": name})
        assert metrics["overall"]["request_count"] == 1, name
        assert "basic" in metrics["technique_filter"] and "rag_basic" not in metrics["technique_filter"]
    with pytest.raises(InvalidParametersError) as unknown:
        loaded_service.metrics({"technique_filter": ["basic", "colbret"]})
    assert "colbret" in unknown.value.message and "colbert" in unknown.value.message


def test_health_asks_an_unreachable_database_once(
    loaded_service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each database question of a health check waited the pool's time out: 15 s while PostgreSQL was down."""
    asked: list[str] = []

    def unreachable(*_: object) -> None:
        asked.append("asked")
        msg = "the PostgreSQL server cannot be reached"
        raise OSError(msg)

    monkeypatch.setattr(loaded_service.store, "ping", unreachable)
    monkeypatch.setattr(loaded_service.store, "stats", unreachable)
    monkeypatch.setattr(loaded_service.monitor, "metrics", unreachable)
    health = loaded_service.health_check({"include_details": True})
    assert asked == ["asked"]
    assert health["status"] == "unhealthy"
    assert health["components"]["vector_store"]["status"] == "unhealthy"
    assert "performance" not in health


class DiskUsage(NamedTuple):
    """shutil.disk_usage's answer."""

    total: int
    used: int
    free: int


def test_health_is_degraded_when_the_sqlite_disk_is_nearly_full(
    loaded_service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report read healthy while SQLite's disk was full and every write failed; it names what is free."""
    gib = 1 << 30
    disk: dict[str, int] = {"total": 500 * gib, "free": 200 * gib}

    def usage(path: str | Path) -> DiskUsage:
        assert Path(path) == loaded_service.settings.data_dir
        return DiskUsage(disk["total"], disk["total"] - disk["free"], disk["free"])

    monkeypatch.setattr(shutil, "disk_usage", usage)
    health = loaded_service.health_check({"include_details": True})
    assert health["status"] == "healthy", health
    assert health["components"]["database"]["details"]["disk_free_bytes"] == 200 * gib

    disk["free"] = 300 << 20  # under 1 GiB (5% of this disk is more)
    health = loaded_service.health_check({"include_details": True})
    database = health["components"]["database"]
    assert health["status"] == database["status"] == "degraded"
    message = database["error_message"]
    assert "300 MiB free" in message and str(loaded_service.settings.data_dir) in message, message
    # A small disk's floor is 5% of it: 300 MiB free of 4 GiB is enough.
    disk["total"] = 4 * gib
    assert loaded_service.health_check({})["status"] == "healthy"
    disk["free"] = 100 << 20
    assert loaded_service.health_check({})["status"] == "degraded"
    # A key granted some collections is told the disk is nearly full, not where the server keeps its files.
    with principal_scope(Principal("other", frozenset({"read"}), frozenset({"docs"}))):
        database = loaded_service.health_check({"include_details": True})["components"]["database"]
    assert database["status"] == "degraded" and "RAG_DATA_DIR" in database["error_message"]
    assert str(loaded_service.settings.data_dir) not in json.dumps(database)

"""CACHE_ENABLED: repeated technique calls answered from memory until the collection changes or TTL ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.embedder import Embedder
from iris_rag.result_cache import ResultCache, cache_key
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS


@pytest.fixture
def cached(tmp_path: Path, embedder: Embedder) -> Iterator[RagService]:
    settings = Settings(RAG_DATA_DIR=tmp_path, CACHE_ENABLED=True, CACHE_TTL_SECONDS=60)
    rag = RagService(settings, embedder=embedder)
    rag.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    yield rag
    rag.close()


def run(service: RagService, technique: str = "basic", **arguments: Any) -> dict[str, Any]:
    return service.execute(
        {"technique": technique, "arguments": {"query": "aspirin", "collection_id": "docs", **arguments}}
    )


def test_a_repeated_call_is_a_hit_with_the_same_result(cached: RagService) -> None:
    first = run(cached, options={"top_k": 2, "generate": False})
    again = run(cached, options={"generate": False, "top_k": 2})  # same arguments, other key order
    assert first["metadata"]["cache"] == {"hit": False}
    assert again["metadata"]["cache"]["hit"] is True and again["metadata"]["cache"]["age_s"] >= 0
    assert again["retrieved_documents"] == first["retrieved_documents"]
    other = run(cached, options={"top_k": 3, "generate": False})
    assert other["metadata"]["cache"] == {"hit": False}, "other arguments, another entry"


def test_a_write_to_the_collection_invalidates_its_results(cached: RagService) -> None:
    run(cached)
    assert run(cached)["metadata"]["cache"]["hit"] is True
    cached.ingest(
        {"collection_id": "docs", "documents": [{"id": "new", "content": "Aspirin and willow bark."}]}
    )
    fresh = run(cached)
    assert fresh["metadata"]["cache"] == {"hit": False}
    assert "new" in {d["id"] for d in fresh["retrieved_documents"]}


def test_results_that_depend_on_more_than_the_documents_are_not_cached(cached: RagService) -> None:
    cached.methods()["ingest_table"]({"table": "sales", "collection_id": "docs", "rows": [{"n": 1}]})
    sql = {"sql": "SELECT n FROM t_sales", "combine_with_vector": False}
    run(cached, "sqlrag", technique_params=sql)
    assert "cache" not in run(cached, "sqlrag", technique_params=sql)["metadata"]


def test_off_by_default(loaded_service: RagService) -> None:
    result = loaded_service.execute(
        {"technique": "basic", "arguments": {"query": "x", "collection_id": "docs"}}
    )
    assert "cache" not in result["metadata"] and loaded_service.result_cache is None


def test_entries_expire_and_the_least_recently_used_go_first() -> None:
    cache = ResultCache(ttl_s=0.05, max_entries=2)
    keys = [cache_key("basic", {"query": str(i)}, 1) for i in range(3)]
    for key in keys:
        cache.put(key, {"n": key})
    assert cache.get(keys[0]) is None, "evicted: past max_entries"
    assert cache.get(keys[2]) is not None
    time.sleep(0.06)
    assert cache.get(keys[2]) is None, "expired"
    assert cache_key("basic", {"a": 1, "b": 2}, 3) == cache_key("basic", {"b": 2, "a": 1}, 3)
    assert cache_key("basic", {"a": 1}, 3) != cache_key("basic", {"a": 1}, 4)


def test_llm_max_tokens_is_the_default_answer_length(tmp_path: Path, embedder: Embedder) -> None:
    rag = RagService(Settings(RAG_DATA_DIR=tmp_path, LLM_MAX_TOKENS=4), embedder=embedder)
    try:
        rag.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        short = run(rag)["answer"]
        longer = run(rag, options={"max_tokens": 200})["answer"]
    finally:
        rag.close()
    assert len(short) < len(longer)

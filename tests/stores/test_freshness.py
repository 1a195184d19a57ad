"""Derived state (vector matrix, NodeRAG leaves, graph entities, vocabularies, ColBERT IDF) follows the file.

Two services on one data folder stand for two processes (the MCP server's worker and `iris-rag ingest`):
each has its own SqliteStore, pipelines and caches, and only the SQLite file in common. A write or delete
through one must be seen by every technique of the other on its next call. The last test runs the real
CLI in a subprocess against a service whose caches are warm.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.embedder import Embedder
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS, ROOT

PENGUIN = {
    "id": "penguin",
    "title": "Emperor penguins of Antarctica",
    "content": "Emperor penguins breed on Antarctic sea ice through the polar winter. "
    "The male emperor penguin incubates the egg on its feet for two months.",
    "metadata": {"year": 2023, "topic": "zoology"},
}
QUERY = "How do emperor penguins incubate their eggs in Antarctica?"
# Every technique whose dense leg, leaf matrix, graph or IDF is cached per collection.
TECHNIQUES = ("basic", "hybrid_ifind", "noderag", "graphrag", "colbert", "crag")


@pytest.fixture
def pair(settings: Settings, embedder: Embedder) -> Iterator[tuple[RagService, RagService]]:
    """A reader and a writer: two services, two stores, one SQLite file."""
    reader = RagService(settings, embedder=embedder)
    writer = RagService(settings, embedder=embedder)
    yield reader, writer
    writer.close()
    reader.close()


def run(service: RagService, technique: str, query: str = QUERY) -> dict[str, Any]:
    arguments = {"query": query, "collection_id": "docs", "options": {"generate": False, "top_k": 3}}
    return service.execute({"technique": technique, "arguments": arguments})


def top_ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


def warm(service: RagService) -> None:
    """Fill every cache of the reader: each technique once, and the explore tool."""
    for technique in TECHNIQUES:
        assert "penguin" not in top_ids(run(service, technique))
    explore(service, "sourdough bread")


def explore(service: RagService, entity: str) -> dict[str, Any]:
    return service.methods()["graph_explore"]({"collection_id": "docs", "entity": entity})


def test_writes_and_deletes_by_another_store_are_seen_on_the_next_call(
    pair: tuple[RagService, RagService],
) -> None:
    reader, writer = pair
    writer.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    warm(reader)

    writer.ingest({"collection_id": "docs", "documents": [PENGUIN]})
    for technique in TECHNIQUES:
        assert top_ids(run(reader, technique))[0] == "penguin", technique
        assert searched(reader, technique) == searched(writer, technique), technique
    details = run(reader, "hybrid_ifind")["retrieved_documents"][0]["score_details"]
    assert details["dense_rank"] == 1  # the dense leg sees it, not only BM25
    assert explore(reader, "emperor penguins")["found"]

    assert writer.store.delete_document("docs", "penguin")
    for technique in TECHNIQUES:
        assert "penguin" not in top_ids(run(reader, technique)), technique
        assert searched(reader, technique) == searched(writer, technique), technique
    assert not explore(reader, "emperor penguins")["found"]


def searched(service: RagService, technique: str) -> int:
    """How many chunks (NodeRAG: sentences) the technique's search went over."""
    return int(run(service, technique)["performance"]["documents_searched"])


def test_cli_ingest_is_seen_by_a_running_service(
    settings: Settings, embedder: Embedder, tmp_path: Path
) -> None:
    """The reproduction: `iris-rag ingest` in another process while the server's caches are warm."""
    server = RagService(settings, embedder=embedder)
    try:
        server.ingest({"collection_id": "docs", "documents": DOCUMENTS})
        warm(server)
        corpus = tmp_path / "penguin.jsonl"
        corpus.write_text(
            json.dumps({"_id": PENGUIN["id"], "title": PENGUIN["title"], "text": PENGUIN["content"]}) + "\n"
        )
        subprocess.run(
            [sys.executable, "-m", "iris_rag.cli", "ingest", str(corpus), "--collection", "docs"],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "RAG_DATA_DIR": str(settings.data_dir), "HF_HUB_OFFLINE": "1"},
            check=True,
            capture_output=True,
            timeout=300,
        )
        for technique in TECHNIQUES:
            assert top_ids(run(server, technique))[0] == "penguin", technique
    finally:
        server.close()


class _GatedConnection:
    """The thread's real connection, except that loading the vector matrix waits for a gate."""

    def __init__(self, connection: Any, gate: threading.Event, loading: threading.Event) -> None:
        self._connection, self._gate, self._loading = connection, gate, loading

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("SELECT chunk_id, document_id, embedding FROM chunks"):
            self._loading.set()
            self._gate.wait(30)
        return self._connection.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)


def test_stats_never_wait_behind_a_matrix_load(
    loaded_service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health reads the store's stats while another call loads a collection's vectors: it answers at once."""
    store = loaded_service.store
    assert isinstance(store, SqliteStore)
    gate, loading = threading.Event(), threading.Event()
    connection_of_thread = store._connection
    monkeypatch.setattr(store, "_connection", lambda: _GatedConnection(connection_of_thread(), gate, loading))
    searching = threading.Thread(target=store.chunk_count, args=("docs",))
    searching.start()
    try:
        assert loading.wait(10)
        with ThreadPoolExecutor(1) as pool:
            stats = pool.submit(store.stats).result(timeout=10)
            health = pool.submit(loaded_service.health_check, {"include_details": True}).result(timeout=10)
        assert stats["documents"] == 3 and health["status"] == "healthy"
    finally:
        gate.set()
        searching.join()

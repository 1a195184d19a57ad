"""request_id and session_id on every tool: validated, echoed in the answer, stored with the call record on
both backends, and listed by rag_metrics (issue 16 item 9)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.monitor import Monitor
from iris_rag.service import RagService
from iris_rag.stores.base import CallRecord
from iris_rag.worker.dispatch import Dispatcher
from tests.conftest import DOCUMENTS

IDS = {"request_id": "req-1", "session_id": "chat-7"}


def _basic(query: str, **extra: Any) -> dict[str, Any]:
    return {"technique": "basic", "arguments": {"query": query, "collection_id": "docs", **extra}}


def test_ids_are_echoed_stored_and_listed(any_service: RagService) -> None:
    dispatcher = Dispatcher(any_service)
    ok, ingested = dispatcher.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS, **IDS})
    assert ok and ingested["request_id"] == "req-1" and ingested["session_id"] == "chat-7"
    ok, answer = dispatcher.call("execute", _basic("lava", request_id="req-2", session_id="chat-7"))
    assert ok and (answer["request_id"], answer["session_id"]) == ("req-2", "chat-7")
    assert answer["retrieved_documents"][0]["id"] == "volcano"
    # Only the ids given come back; a call without any has neither.
    ok, plain = dispatcher.call("execute", _basic("lava"))
    assert ok and "request_id" not in plain and "session_id" not in plain
    ok, only_session = dispatcher.call("list_collections", {"session_id": "chat-7"})
    assert ok and only_session["session_id"] == "chat-7" and "request_id" not in only_session
    # A failure echoes them in its details.
    ok, error = dispatcher.call("get_document", {"document_id": "nope", "collection_id": "docs", **IDS})
    assert not ok and error["code"] == "DOCUMENT_NOT_FOUND"
    assert (error["details"]["request_id"], error["details"]["session_id"]) == ("req-1", "chat-7")

    any_service.monitor.flush()
    # Stored with the call record: a fresh monitor on the same store (a restart) lists them.
    metrics = Monitor(any_service.store).metrics("1h")
    recent = metrics["recent_calls"]
    assert [c["tool"] for c in recent[:5]] == [
        "rag_get_document",
        "rag_list_collections",
        "rag_basic",
        "rag_basic",
        "rag_ingest",
    ]
    assert [(c["request_id"], c["session_id"]) for c in recent[:5]] == [
        ("req-1", "chat-7"),
        (None, "chat-7"),
        (None, None),
        ("req-2", "chat-7"),
        ("req-1", "chat-7"),
    ]
    assert recent[0]["error_code"] == "DOCUMENT_NOT_FOUND" and recent[0]["success"] is False
    last = metrics["by_tool"]["rag_get_document"]["last_execution_time"]
    assert last == recent[0]["timestamp"]
    assert metrics["overall"]["last_execution_time"] == recent[0]["timestamp"]


def test_a_cached_answer_echoes_each_calls_own_ids(tmp_path: Path, embedder: Any) -> None:
    from iris_rag.settings import Settings

    service = RagService(Settings(RAG_DATA_DIR=tmp_path, CACHE_ENABLED=True), embedder=embedder)
    try:
        dispatcher = Dispatcher(service)
        dispatcher.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
        _, first = dispatcher.call("execute", _basic("lava", request_id="a"))
        _, second = dispatcher.call("execute", _basic("lava", request_id="b"))
        assert second["metadata"]["cache"]["hit"] is True
        assert (first["request_id"], second["request_id"]) == ("a", "b")
        _, third = dispatcher.call("execute", _basic("lava"))
        assert "request_id" not in third, "the cached result was not changed by an echo"
    finally:
        service.close()


def test_ids_that_are_not_short_strings_are_refused(loaded_service: RagService) -> None:
    dispatcher = Dispatcher(loaded_service)
    for bad in (7, "", "x" * 129):
        ok, error = dispatcher.call("execute", _basic("lava", request_id=bad))
        assert not ok and error["code"] == "INVALID_PARAMETERS", (bad, error)
        assert "request_id" not in error.get("details", {}), "an invalid id is not echoed"


def test_an_older_sqlite_call_log_gains_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old = SqliteStore(path)
    old.record_call(CallRecord(time.time(), "rag_basic", "basic", 1.0, True, None))
    old.close()
    with sqlite3.connect(path) as connection:  # as version 6 made it
        connection.execute("ALTER TABLE calls DROP COLUMN request_id")
        connection.execute("ALTER TABLE calls DROP COLUMN session_id")
        connection.execute("PRAGMA user_version = 6")
    reopened = SqliteStore(path)
    reopened.record_call(CallRecord(time.time(), "rag_basic", "basic", 2.0, True, None, None, "r", "s"))
    calls = reopened.calls_since(0)
    assert [(c.request_id, c.session_id) for c in calls] == [(None, None), ("r", "s")]
    reopened.close()


def test_tools_with_their_own_request_models_take_the_ids(service: RagService) -> None:
    """rag_smart_questions and rag_generate_podcast parse their arguments with strict models: the ids, on
    every tool's schema, must reach the dispatcher's echo, not the model (it refused them before)."""
    dispatcher = Dispatcher(service)
    ok, _ = dispatcher.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
    assert ok
    calls = {
        "smart_questions": {"collection_id": "docs", "context": "volcanoes and lava", "count": 1},
        "generate_podcast": {"collection_id": "docs", "topic": "volcanoes", "duration_minutes": 1},
    }
    for method, arguments in calls.items():
        ok, answer = dispatcher.call(method, {**arguments, **IDS})
        assert ok, (method, answer)
        assert (answer["request_id"], answer["session_id"]) == ("req-1", "chat-7"), method

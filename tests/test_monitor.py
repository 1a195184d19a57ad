import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.monitor import PRUNE_EVERY_S, WINDOWS_S, Monitor
from iris_rag.service import RagService
from iris_rag.stores.base import CallRecord, DocumentStore
from tests.conftest import raise_unwritable_store


def test_windows_percentiles_and_restart(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db.sqlite3")
    now = time.time()
    durations = [float(d) for d in range(1, 101)]
    for d in durations:
        store.record_call(CallRecord(now - 60, "rag_basic", "basic", d, d != 100, None if d != 100 else "X"))
    store.record_call(CallRecord(now - 2 * 86_400, "rag_basic", "basic", 5000.0, True, None))
    store.record_call(CallRecord(now - 30, "rag_ingest", None, 7.0, True, None))
    store.close()

    monitor = Monitor(SqliteStore(tmp_path / "db.sqlite3"))  # a fresh process would see the same
    day = monitor.metrics("24h")
    basic = day["by_technique"]["basic"]
    assert basic["request_count"] == 100
    assert basic["error_count"] == 1
    assert basic["error_codes"] == {"X": 1}
    assert basic["p50_ms"] == round(float(np.percentile(durations, 50)), 3)
    assert basic["p95_ms"] == round(float(np.percentile(durations, 95)), 3)
    assert basic["p99_ms"] == round(float(np.percentile(durations, 99)), 3)
    assert basic["requests_per_minute"] == round(100 / (24 * 60), 4)
    assert day["overall"]["request_count"] == 101
    assert set(day["by_tool"]) == {"rag_basic", "rag_ingest"}

    week = monitor.metrics("7d", technique_filter="basic")
    assert week["overall"]["request_count"] == 101
    assert "rag_ingest" not in week["by_tool"]
    assert monitor.metrics("1h", technique_filter="nope")["overall"]["request_count"] == 0
    # The spec's array form, alone or with others; reported as a list either way.
    assert week["technique_filter"] == ["basic"]
    both = monitor.metrics("7d", technique_filter=["basic", "nope"])
    assert both["overall"]["request_count"] == 101 and both["technique_filter"] == ["basic", "nope"]


def _answered_within(seconds: float, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The call's answer, run on a thread; fails if it has not answered in time (a hang, not speed)."""
    answers: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: answers.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert answers, f"no answer within {seconds} s: it waited for the writer"
    return answers[0]


@contextmanager
def _in_process_writer(store: SqliteStore) -> Iterator[None]:
    """What an ingest in this process holds during its transaction: the store's write lock."""
    with store._write_lock:
        yield


@contextmanager
def _other_process_writer(store: SqliteStore) -> Iterator[None]:
    """What an ingest by another process (the CLI) holds: SQLite's write lock on the file."""
    connection = sqlite3.connect(store.path, isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        connection.execute("ROLLBACK")
        connection.close()


@pytest.mark.parametrize("writer", [_in_process_writer, _other_process_writer])
def test_metrics_and_health_answer_while_a_writer_holds_the_store(
    service: RagService, writer: Callable[[SqliteStore], AbstractContextManager[None]]
) -> None:
    store = service.store
    assert isinstance(store, SqliteStore)
    service.monitor.record("rag_basic", "basic", 5.0, True, None)
    service.monitor.flush()
    with writer(store):
        service.monitor.record("rag_basic", "basic", 7.0, False, "TIMEOUT_EXCEEDED")  # its write must wait
        metrics = _answered_within(10, lambda: service.metrics({"time_range": "1h"}))
        health = _answered_within(10, lambda: service.health_check({"include_details": True}))
    basic = metrics["by_technique"]["basic"]
    assert (basic["request_count"], basic["error_count"]) == (2, 1)
    assert basic["error_codes"] == {"TIMEOUT_EXCEEDED": 1}
    assert health["components"]["database"]["status"] == "healthy"
    service.monitor.flush()  # stored once the writer is gone, and counted once
    assert service.metrics({"time_range": "1h"})["overall"]["request_count"] == 2


def test_a_store_that_cannot_be_written_costs_one_log_line_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk logged SQLite's whole traceback for every call the server answered."""
    store = SqliteStore(tmp_path / "db.sqlite3")

    def full(_record: CallRecord) -> None:
        raise_unwritable_store()

    monkeypatch.setattr(store, "record_call", full)
    monitor = Monitor(store)
    for _ in range(3):
        monitor.record("rag_basic", "basic", 5.0, True, None)
    monitor.flush()
    lines = [r for r in caplog.records if "could not store a call record" in r.getMessage()]
    assert len(lines) == 3
    assert all(r.exc_info is None and "RAG_DATA_DIR" in r.getMessage() for r in lines)
    assert monitor.metrics("1h")["overall"]["request_count"] == 3  # still counted from memory


def test_records_no_window_reaches_are_deleted_at_most_once_an_hour(any_store: DocumentStore) -> None:
    """The call log was never pruned: a long-running shared service grew it for ever."""
    now = time.time()
    expired = CallRecord(now - WINDOWS_S["30d"] - 60, "rag_basic", "basic", 1.0, True, None)
    kept = CallRecord(now - WINDOWS_S["30d"] + 600, "rag_basic", "basic", 2.0, True, None)
    any_store.record_call(expired)
    any_store.record_call(kept)
    monitor = Monitor(any_store)
    monitor.record("rag_basic", "basic", 3.0, True, None)  # a process's first record prunes
    monitor.flush()
    assert [r.duration_ms for r in any_store.calls_since(0)] == [2.0, 3.0]
    assert monitor.metrics("30d")["overall"]["request_count"] == 2
    # Not on every record: the next prune waits an hour.
    any_store.record_call(expired)
    monitor.record("rag_basic", "basic", 4.0, True, None)
    monitor.flush()
    assert [r.duration_ms for r in any_store.calls_since(0)] == [1.0, 2.0, 3.0, 4.0]
    monitor._pruned_at -= PRUNE_EVERY_S
    monitor.record("rag_basic", "basic", 5.0, True, None)
    monitor.flush()
    assert [r.duration_ms for r in any_store.calls_since(0)] == [2.0, 3.0, 4.0, 5.0]

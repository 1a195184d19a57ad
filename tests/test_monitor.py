import random
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.access import Principal, principal_scope
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.monitor import PRUNE_EVERY_S, WINDOWS_S, Monitor
from iris_rag.service import RagService
from iris_rag.stores.base import CallFilter, CallRecord, CallTotals, DocumentStore
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


def _stats_of_every_record(records: list[CallRecord], window_minutes: float) -> dict[str, Any]:
    """One group's figures as the monitor computed them from every record read into Python."""
    count = len(records)
    successes = sum(r.success for r in records)
    durations = np.array([r.duration_ms for r in records], dtype=np.float64)
    p50, p95, p99 = np.percentile(durations, [50, 95, 99]) if count else (0.0, 0.0, 0.0)
    last = max((r.timestamp for r in records), default=None)
    return {
        "request_count": count,
        "success_count": successes,
        "error_count": count - successes,
        "success_rate": round(successes / count, 4) if count else 0.0,
        "error_rate": round((count - successes) / count, 4) if count else 0.0,
        "avg_ms": round(float(durations.mean()), 3) if count else 0.0,
        "p50_ms": round(float(p50), 3),
        "p95_ms": round(float(p95), 3),
        "p99_ms": round(float(p99), 3),
        "requests_per_minute": round(count / window_minutes, 4),
        "error_codes": dict(Counter(r.error_code for r in records if r.error_code)),
        "last_execution_time": None
        if last is None
        else datetime.fromtimestamp(last, UTC).isoformat("T", "milliseconds"),
    }


def _metrics_of_every_record(
    records: list[CallRecord], window_s: int, techniques: list[str] | None, caller: Principal | None
) -> dict[str, Any]:
    """rag_metrics' figures (less the window's ends) as computed before from every record of the window."""
    if techniques is not None:
        records = [r for r in records if r.technique in techniques]
    everyone = caller is None or caller.admin
    if not everyone:
        records = [r for r in records if caller is not None and r.principal == caller.id]
    minutes = window_s / 60

    def grouped(key: Callable[[CallRecord], str | None]) -> dict[str, Any]:
        groups: dict[str, list[CallRecord]] = defaultdict(list)
        for record in records:
            if name := key(record):
                groups[name].append(record)
        return {name: _stats_of_every_record(rs, minutes) for name, rs in sorted(groups.items())}

    newest = sorted(records, key=lambda r: -r.timestamp)[:20]
    return {
        "technique_filter": techniques,
        "overall": _stats_of_every_record(records, minutes),
        "by_technique": grouped(lambda r: r.technique),
        "by_tool": grouped(lambda r: r.tool),
        **({"by_principal": grouped(lambda r: r.principal or "local")} if everyone else {}),
        "recent_calls": [
            {
                "timestamp": datetime.fromtimestamp(r.timestamp, UTC).isoformat("T", "milliseconds"),
                "tool": r.tool,
                "technique": r.technique,
                "duration_ms": round(r.duration_ms, 3),
                "success": r.success,
                "error_code": r.error_code,
                "request_id": r.request_id,
                "session_id": r.session_id,
            }
            for r in newest
        ],
    }


def _random_records(count: int, now: float, rng: random.Random) -> list[CallRecord]:
    """Calls over the last day (none near the hour's edge: the two computations' `now` differ)."""
    records = []
    for number in range(count):
        age = rng.uniform(5, 3500) if rng.random() < 0.6 else rng.uniform(3700, 80_000)
        technique = rng.choice(["basic", "crag", "hyde", None])
        error = rng.choice([None, None, None, "TIMEOUT_EXCEEDED", "INVALID_PARAMETERS"])
        records.append(
            CallRecord(
                now - age,
                f"rag_{technique}" if technique else rng.choice(["rag_ingest", "rag_metrics"]),
                technique,
                rng.lognormvariate(3, 1),
                error is None,
                error,
                rng.choice([None, "alice", "bob", "ops"]),
                f"r{number}" if rng.random() < 0.3 else None,
                rng.choice([None, "s1"]),
            )
        )
    return records


ALICE = Principal("alice", frozenset({"read"}), None)
OPS = Principal("ops", frozenset({"admin"}), None)


def test_metrics_and_health_from_the_store_equal_the_figures_of_every_record(
    any_store: DocumentStore,
) -> None:
    """rag_metrics and health read every call record of the window into Python: their figures stay."""
    if any_store.backend_name == "iris":
        pytest.skip("IRIS stores no request_id or session_id")
    rng = random.Random(7)
    now = time.time()
    records = _random_records(400, now, rng)
    for record in records[:-5]:
        any_store.record_call(record)
    monitor = Monitor(any_store)
    # The last five are not stored yet (the writer waits), and one stored record is still in memory too
    # (stored between the two reads): every call is counted once.
    in_memory = [*records[-5:], records[-6]]
    monitor._unstored.update(enumerate(in_memory, start=1000))
    for time_range in ("1h", "24h"):
        window = WINDOWS_S[time_range]
        stored = sorted(records[:-5], key=lambda r: r.timestamp)  # read in time order, then memory's
        in_window = [r for r in [*stored, *records[-5:]] if r.timestamp >= now - window]
        for caller in (None, ALICE, OPS):
            for techniques in (None, ["basic"], ["basic", "crag", "nope"]):
                with principal_scope(caller):
                    figures = monitor.metrics(time_range, techniques)
                for end in ("time_range", "window_start", "window_end"):
                    figures.pop(end)
                assert figures == _metrics_of_every_record(in_window, window, techniques, caller)

    def performance(records: list[CallRecord], caller: Principal | None) -> dict[str, Any]:
        overall = _metrics_of_every_record(records, 3600, None, caller)["overall"]
        return {
            "window": "1h",
            "request_count": overall["request_count"],
            "avg_response_time_ms": overall["avg_ms"],
            "requests_per_minute": overall["requests_per_minute"],
            "error_rate": overall["error_rate"],
        }

    hour = [r for r in [*stored, *records[-5:]] if r.timestamp >= now - 3600]
    for caller in (None, ALICE, OPS):
        with principal_scope(caller):
            assert monitor.performance() == performance(hour, caller)
    for record in records[-5:]:  # all stored: the store's sums alone
        any_store.record_call(record)
    monitor._unstored.clear()
    monitor._summaries.clear()
    for caller in (None, ALICE):
        with principal_scope(caller):
            assert monitor.performance() == performance(hour, caller)


def test_health_and_metrics_read_no_call_record_but_the_recent_ones(
    service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health (GET /health: once a second) took 2.3 s with 100,000 calls in the hour: it read them all."""
    for _ in range(3):
        service.monitor.record("rag_basic", "basic", 5.0, True, None)
    service.monitor.flush()
    read: list[float] = []
    every_record = service.store.calls_since

    def calls_since(since: float) -> list[CallRecord]:
        read.append(since)
        return every_record(since)

    monkeypatch.setattr(service.store, "calls_since", calls_since)
    sums = service.store.call_totals
    summed: list[CallFilter] = []

    def call_totals(which: CallFilter, before: float | None = None) -> CallTotals:
        summed.append(which)
        return sums(which, before)

    monkeypatch.setattr(service.store, "call_totals", call_totals)
    assert service.health_check({})["performance"]["request_count"] == 3
    assert service.health_check({})["performance"]["request_count"] == 3
    assert len(summed) == 1  # once per SUMMARY_FRESH_S
    assert service.metrics({"time_range": "30d"})["overall"]["request_count"] == 3
    assert read == []


def test_records_a_store_refused_are_stored_once_it_accepts_writes_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk's (or a lost server's) records stayed in memory for the process's life, never stored."""
    store = SqliteStore(tmp_path / "db.sqlite3")
    write = store.record_call
    down = True

    def maybe_full(record: CallRecord) -> None:
        if down:
            raise_unwritable_store()
        write(record)

    monkeypatch.setattr(store, "record_call", maybe_full)
    monitor = Monitor(store)
    for code in ("DATABASE_CONNECTION_FAILED", "DATABASE_CONNECTION_FAILED"):
        monitor.record("rag_basic", "basic", 5.0, False, code)
    monitor.flush()
    down = False
    monitor.record("rag_basic", "basic", 6.0, True, None)  # the next write stores the kept ones first
    monitor.flush()
    assert not monitor._unstored
    restarted = Monitor(SqliteStore(tmp_path / "db.sqlite3"))  # the outage's calls survive a restart
    overall = restarted.metrics("1h")["overall"]
    assert overall["request_count"] == 3
    assert overall["error_codes"] == {"DATABASE_CONNECTION_FAILED": 2}
    assert [c["duration_ms"] for c in restarted.metrics("1h")["recent_calls"]] == [6.0, 5.0, 5.0]


def test_records_kept_for_a_store_that_refuses_them_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the cap the oldest kept record is dropped, and the log says how many were."""
    store = SqliteStore(tmp_path / "db.sqlite3")

    def full(_record: CallRecord) -> None:
        raise_unwritable_store()

    monkeypatch.setattr(store, "record_call", full)
    monitor = Monitor(store, max_unstored=3)
    for duration in range(5):
        monitor.record("rag_basic", "basic", float(duration), True, None)
    monitor.flush()
    assert sorted(r.duration_ms for r in monitor._unstored.values()) == [2.0, 3.0, 4.0]
    assert any("2 call records dropped" in r.getMessage() for r in caplog.records)

import time
from pathlib import Path

import numpy as np

from iris_rag.monitor import Monitor
from iris_rag.stores.base import CallRecord
from iris_rag.stores.sqlite import SqliteStore


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

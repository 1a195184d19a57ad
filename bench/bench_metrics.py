"""What rag_health_check and rag_metrics cost as the call log grows: 0 / 10,000 / 100,000 calls in the hour.

For each size, a fresh SQLite data folder whose call log holds that many synthetic records from the last
50 minutes (a few tools and techniques, 2% errors; 99% of them by the key "busy", 1% by "quiet"), written
straight into the table as the monitor would have. Printed: the median of `--repeat` health checks
(`rag_health_check {}`; also with its performance block computed afresh each time, as when it is older than
SUMMARY_FRESH_S) and rag_metrics calls (time_range 1h) as the local user (everyone's calls, with the per-key
breakdown) and as the key "quiet" (its own calls only), in ms, after one warm-up call each.

    .venv/bin/python -m bench.bench_metrics [--sizes 0,10000,100000] [--repeat 5] [--json FILE]

The code measured is the `iris_rag` imported: run it from another checkout (a `git archive` of a commit,
with this file copied in) to measure that commit.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import iris_rag
from bench.common import machine, patched
from iris_rag import monitor
from iris_rag.access import Principal, principal_scope
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings

QUIET = Principal("quiet", frozenset({"read"}), None)
TECHNIQUES = ["basic", "crag", "hyde", "hybrid_ifind"]


def _records(count: int, now: float, rng: random.Random) -> list[tuple[Any, ...]]:
    """Call rows of the last 50 minutes (ts, tool, technique, duration_ms, success, error_code, principal)."""
    rows = []
    for _ in range(count):
        technique = rng.choice(TECHNIQUES)
        failed = rng.random() < 0.02
        rows.append(
            (
                now - rng.random() * 3000,
                f"rag_{technique}",
                technique,
                rng.lognormvariate(3, 1),
                int(not failed),
                "TIMEOUT_EXCEEDED" if failed else None,
                "quiet" if rng.random() < 0.01 else "busy",
            )
        )
    return rows


def _median_ms(call: Callable[[], Any], repeat: int) -> float:
    call()  # warm-up: connections, caches
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 2)


def measure(size: int, repeat: int, folder: Path) -> dict[str, Any]:
    """One fresh data folder holding `size` calls in the hour: health and metrics medians (ms)."""
    service = RagService(Settings(data_dir=folder, techniques="basic"))
    try:
        service.health_check({})  # the store exists, its schema written
        connection = sqlite3.connect(folder / "iris_rag.sqlite3")
        with connection:
            connection.executemany(
                "INSERT INTO calls (ts, tool, technique, duration_ms, success, error_code, principal) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                _records(size, time.time(), random.Random(size)),
            )
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # as a log written over an hour would be
        connection.close()

        def quiet_metrics() -> dict[str, Any]:
            with principal_scope(QUIET):
                return service.metrics({"time_range": "1h"})

        # A commit before the summary's cache has no SUMMARY_FRESH_S: every check is afresh there.
        afresh = {"SUMMARY_FRESH_S": 0.0} if hasattr(monitor, "SUMMARY_FRESH_S") else {}
        with patched(monitor, **afresh):
            health_afresh = _median_ms(lambda: service.health_check({}), repeat)
        return {
            "calls_in_hour": size,
            "health_check_ms": _median_ms(lambda: service.health_check({}), repeat),
            "health_check_afresh_ms": health_afresh,
            "metrics_ms": _median_ms(lambda: service.metrics({"time_range": "1h"}), repeat),
            "metrics_one_key_ms": _median_ms(quiet_metrics, repeat),
        }
    finally:
        service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="0,10000,100000", help="calls in the hour, comma-separated")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    limit_blas_threads()
    rows = []
    print(f"iris_rag from {Path(iris_rag.__file__).parent}")
    print(f"{'calls in hour':>14} {'health ms':>10} {'afresh ms':>10} {'metrics ms':>11} {'one key ms':>11}")
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench_metrics_") as folder:
            row = measure(size, args.repeat, Path(folder))
        rows.append(row)
        health, afresh = row["health_check_ms"], row["health_check_afresh_ms"]
        everyone, one_key = row["metrics_ms"], row["metrics_one_key_ms"]
        print(f"{size:>14,} {health:>10} {afresh:>10} {everyone:>11} {one_key:>11}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

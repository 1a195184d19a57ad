"""The performance monitor: every call recorded in the store, statistics over time windows."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import numpy as np

from iris_rag.access import current_principal
from iris_rag.backends import connection_failure
from iris_rag.schemas import CORRELATION_FIELDS
from iris_rag.stores.base import CallLog, CallRecord
from iris_rag.text import without_nul

logger = logging.getLogger(__name__)

WINDOWS_S = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
# Records older than the longest window are read by no query: the writer deletes them, at most once per
# PRUNE_EVERY_S in each process (a DELETE per record would cost as much as the record).
RETAINED_S = max(WINDOWS_S.values())
PRUNE_EVERY_S = 3600
RECENT_CALLS = 20  # rag_metrics' recent_calls: the window's latest calls, newest first
MAX_ID_CHARS = 128  # common.json's request_id and session_id


def correlation_of(arguments: Any) -> dict[str, str]:
    """The caller's request_id and session_id from a tool's arguments (those that are valid ids)."""
    if not isinstance(arguments, dict):
        return {}
    # A NUL is dropped, as at ingest: PostgreSQL's text cannot hold one (the record would be lost).
    return {
        name: value
        for name in CORRELATION_FIELDS
        if isinstance(value := without_nul(arguments.get(name)), str) and 0 < len(value) <= MAX_ID_CHARS
    }


class Monitor:
    """Records calls durably, so windows longer than one process's life are right after a restart.

    Records are written by a background thread: a write to the store never delays the answer it describes.
    Until a record is stored it is also kept in memory, so metrics never wait for that write (which may
    wait for an ingest's write lock) and still count every call. The same thread deletes the records no
    window reaches any more (RETAINED_S), so a long-running service's call log stays bounded.
    """

    def __init__(self, store: CallLog) -> None:
        self.store = store
        self.started_at = time.time()
        self._pending: queue.Queue[tuple[int, CallRecord]] = queue.Queue()
        self._unstored: dict[int, CallRecord] = {}
        self._unstored_lock = threading.Lock()
        self._numbers = itertools.count()
        self._pruned_at = 0.0  # when this process last deleted expired records: its first record prunes
        threading.Thread(target=self._write_forever, name="monitor", daemon=True).start()

    def record(
        self,
        tool: str,
        technique: str | None,
        duration_ms: float,
        success: bool,
        error_code: str | None,
        *,
        request_id: str | None = None,
        session_id: str | None = None,
    ) -> None:
        """Queue one call for storing, with the caller's request_id and session_id if it gave them."""
        principal = current_principal()
        record = CallRecord(
            time.time(),
            tool,
            technique,
            duration_ms,
            success,
            error_code,
            principal.id if principal else None,
            request_id,
            session_id,
        )
        number = next(self._numbers)
        with self._unstored_lock:
            self._unstored[number] = record
        self._pending.put((number, record))

    def _write_forever(self) -> None:
        while True:
            number, record = self._pending.get()
            try:
                self.store.record_call(record)
            except Exception as exc:
                # Kept in memory: this process still counts it. A store that cannot be used (a full disk, a
                # lost server) fails every record alike: one line each, not a traceback each.
                failure = connection_failure(exc)
                if failure is None:
                    logger.exception("could not store a call record")
                else:
                    logger.warning("could not store a call record: %s", failure.message)
            else:
                with self._unstored_lock:
                    del self._unstored[number]
                self._prune_when_due()
            finally:
                self._pending.task_done()

    def _prune_when_due(self) -> None:
        """Delete the records older than RETAINED_S, if the last time was PRUNE_EVERY_S ago; never raises."""
        now = time.time()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        try:
            self.store.forget_calls_before(now - RETAINED_S)
        except Exception as exc:  # tried again in an hour; the records stay readable meanwhile
            failure = connection_failure(exc)
            if failure is None:
                logger.exception("could not delete expired call records")
            else:
                logger.warning("could not delete expired call records: %s", failure.message)

    def flush(self) -> None:
        """Wait until every queued record is stored."""
        self._pending.join()

    def metrics(
        self, time_range: str = "1h", technique_filter: str | list[str] | None = None
    ) -> dict[str, Any]:
        """Counts, rates and latency percentiles, overall, per technique and per tool; never waits."""
        now = time.time()
        window = WINDOWS_S[time_range]
        records = self._calls_since(now - window)
        # One name or several (the spec's array); reported as a list either way.
        techniques = [technique_filter] if isinstance(technique_filter, str) else technique_filter
        if techniques is not None:
            records = [r for r in records if r.technique in techniques]
        # Everyone's calls for the local user and admins (with a breakdown); a key's own calls otherwise.
        caller = current_principal()
        everyone = caller is None or caller.admin
        if caller is not None and not everyone:
            records = [r for r in records if r.principal == caller.id]
        minutes = window / 60
        by_technique: dict[str, list[CallRecord]] = defaultdict(list)
        by_tool: dict[str, list[CallRecord]] = defaultdict(list)
        for record in records:
            by_tool[record.tool].append(record)
            if record.technique:
                by_technique[record.technique].append(record)
        return {
            "time_range": time_range,
            "window_start": _iso(now - window),
            "window_end": _iso(now),
            "technique_filter": techniques,
            "overall": call_stats(records, minutes),
            "by_technique": {name: call_stats(rs, minutes) for name, rs in sorted(by_technique.items())},
            "by_tool": {name: call_stats(rs, minutes) for name, rs in sorted(by_tool.items())},
            **({"by_principal": _by_principal(records, minutes)} if everyone else {}),
            "recent_calls": [_call_summary(r) for r in sorted(records, key=lambda r: -r.timestamp)][
                :RECENT_CALLS
            ],
        }

    def _calls_since(self, since: float) -> list[CallRecord]:
        """Stored records (read without the write lock: WAL readers never wait) and those not yet stored."""
        # Memory first, then the store: a record stored in between is in both, and counted once.
        with self._unstored_lock:
            unstored = [r for r in self._unstored.values() if r.timestamp >= since]
        stored = self.store.calls_since(since)
        seen = Counter(stored)
        records = list(stored)
        for record in unstored:
            if seen[record] > 0:
                seen[record] -= 1
            else:
                records.append(record)
        return records


def call_stats(records: list[CallRecord], window_minutes: float) -> dict[str, Any]:
    """Statistics of one group of calls."""
    count = len(records)
    successes = sum(r.success for r in records)
    durations = np.array([r.duration_ms for r in records], dtype=np.float64)
    p50, p95, p99 = np.percentile(durations, [50, 95, 99]) if count else (0.0, 0.0, 0.0)
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
        "last_execution_time": _iso(max(r.timestamp for r in records), "milliseconds") if count else None,
    }


def _call_summary(record: CallRecord) -> dict[str, Any]:
    """One call as recent_calls lists it."""
    return {
        "timestamp": _iso(record.timestamp, "milliseconds"),
        "tool": record.tool,
        "technique": record.technique,
        "duration_ms": round(record.duration_ms, 3),
        "success": record.success,
        "error_code": record.error_code,
        "request_id": record.request_id,
        "session_id": record.session_id,
    }


def _by_principal(records: list[CallRecord], window_minutes: float) -> dict[str, Any]:
    """Statistics per caller; the local user's calls (stdio, CLI) under "local"."""
    groups: dict[str, list[CallRecord]] = defaultdict(list)
    for record in records:
        groups[record.principal or "local"].append(record)
    return {name: call_stats(rs, window_minutes) for name, rs in sorted(groups.items())}


def _iso(timestamp: float, timespec: str = "seconds") -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec=timespec)

"""The performance monitor: every call recorded in the store, statistics over time windows."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from bisect import bisect_left
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Iterable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.access import current_principal
from iris_rag.backends import connection_failure
from iris_rag.schemas import CORRELATION_FIELDS
from iris_rag.stores.base import CallFigures, CallFilter, CallLog, CallRecord
from iris_rag.text import without_nul

logger = logging.getLogger(__name__)

WINDOWS_S = {"1h": 3600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
# Records older than the longest window are read by no query: the writer deletes them, at most once per
# PRUNE_EVERY_S in each process (a DELETE per record would cost as much as the record).
RETAINED_S = max(WINDOWS_S.values())
PRUNE_EVERY_S = 3600
RECENT_CALLS = 20  # rag_metrics' recent_calls: the window's latest calls, newest first
# Health's performance block is this fresh at worst: GET /health may ask once a second, and the store's sums
# cover every call of the hour.
SUMMARY_FRESH_S = 5.0
MAX_ID_CHARS = 128  # common.json's request_id and session_id
# Records a store refused (a full disk, a lost server) are kept to store once it takes writes again, at most
# this many (some tens of MB; hours of calls at a call a second): past it the oldest go, counted in the log.
MAX_UNSTORED_RECORDS = 50_000
# While records wait for a store that refused them, it is tried again this often even if no call comes.
RETRY_UNSTORED_S = 30.0


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
    wait for an ingest's write lock) and still count every call. A record the store refuses (a full disk,
    a lost server) waits in memory and is written, oldest first, once the store takes writes again (tried
    at each new record, and every RETRY_UNSTORED_S); at most max_unstored wait, the oldest dropped past it.
    The same thread deletes the records no window reaches any more (RETAINED_S), so a long-running
    service's call log stays bounded.
    """

    def __init__(self, store: CallLog, max_unstored: int = MAX_UNSTORED_RECORDS) -> None:
        self.store = store
        self.started_at = time.time()
        self.max_unstored = max_unstored
        self.dropped = 0  # records dropped past max_unstored, never stored
        self._pending: queue.Queue[tuple[int, CallRecord]] = queue.Queue()
        # Those the store refused, oldest first: only the writer thread touches it.
        self._refused: deque[tuple[int, CallRecord]] = deque()
        self._unstored: dict[int, CallRecord] = {}
        self._unstored_lock = threading.Lock()
        self._numbers = itertools.count()
        self._pruned_at = 0.0  # when this process last deleted expired records: its first record prunes
        # performance()'s answers by window and key, with when each was computed.
        self._summaries: dict[tuple[str, str | None], tuple[float, dict[str, Any]]] = {}
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
            try:
                item = self._pending.get(timeout=RETRY_UNSTORED_S if self._refused else None)
            except queue.Empty:
                self._store_refused()
                continue
            try:
                self._refused.append(item)
                self._store_refused(logged=True)
                self._drop_past_cap()
            finally:
                self._pending.task_done()

    def _store_refused(self, *, logged: bool = False) -> None:
        """Store the waiting records oldest first, until the store refuses one (then it is down still).

        `logged`: a new record came, and its failure is logged (one line a call, as before any retry).
        """
        while self._refused:
            number, record = self._refused[0]
            try:
                self.store.record_call(record)
            except Exception as exc:
                failure = connection_failure(exc)
                if failure is None:
                    # Not the store being unusable but this record: retrying it would hold up the rest.
                    logger.exception("could not store a call record; it is dropped")
                    self._forget_oldest_refused()
                    continue
                # A store that cannot be used (a full disk, a lost server) fails every record alike: one line
                # each, not a traceback each.
                if logged:
                    logger.warning("could not store a call record: %s", failure.message)
                return
            self._refused.popleft()
            with self._unstored_lock:
                del self._unstored[number]
            self._prune_when_due()

    def _drop_past_cap(self) -> None:
        """Forget the oldest records the store refused past max_unstored, so memory stays bounded."""
        if len(self._refused) <= self.max_unstored:
            return
        while len(self._refused) > self.max_unstored:
            self._forget_oldest_refused()
        logger.warning(
            "%d call records dropped so far: the store refused them and %d more wait in memory "
            "(MAX_UNSTORED_RECORDS); rag_metrics misses them",
            self.dropped,
            len(self._refused),
        )

    def _forget_oldest_refused(self) -> None:
        number, _ = self._refused.popleft()
        with self._unstored_lock:
            del self._unstored[number]
        self.dropped += 1

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
        # One name or several (the spec's array); reported as a list either way.
        techniques = [technique_filter] if isinstance(technique_filter, str) else technique_filter
        which = _callers_calls(now - window, techniques)
        # Memory first, then the store: a record stored in between is in both, and counted once.
        unstored = [r for r in self._unstored_since(which.since) if _covers(which, r)]
        stored = self.store.call_figures(which)
        later = stored[
            bisect_left(stored, min((r.timestamp for r in unstored), default=now), key=_timestamp) :
        ]
        unstored = _unmatched(unstored, later, _figures)
        calls = _Calls([*stored, *(_figures(r) for r in unstored)])
        minutes = window / 60
        recent = self.store.recent_calls(which, RECENT_CALLS)
        newest = sorted([*recent, *_unmatched(unstored, recent)], key=lambda r: -r.timestamp)[:RECENT_CALLS]
        return {
            "time_range": time_range,
            "window_start": _iso(now - window),
            "window_end": _iso(now),
            "technique_filter": techniques,
            "overall": calls.stats(np.arange(len(calls.durations)), minutes),
            "by_technique": calls.grouped(calls.techniques, minutes),
            "by_tool": calls.grouped(calls.tools, minutes),
            **({"by_principal": calls.grouped(calls.principals, minutes)} if which.principal is None else {}),
            "recent_calls": [_call_summary(r) for r in newest],
        }

    def performance(self, time_range: str = "1h") -> dict[str, Any]:
        """Health's summary of the caller's calls in a window: the store's sums, up to SUMMARY_FRESH_S old."""
        now = time.time()
        window = WINDOWS_S[time_range]
        which = _callers_calls(now - window)
        cached = self._summaries.get((time_range, which.principal))
        if cached is not None and now - cached[0] < SUMMARY_FRESH_S:
            return dict(cached[1])
        unstored = [r for r in self._unstored_since(which.since) if _covers(which, r)]
        if unstored:
            # The store sums the rows before the first record in memory and hands over those from it on, so
            # a record stored in between is matched and counted once.
            first = min(r.timestamp for r in unstored)
            totals = self.store.call_totals(which, first)
            later = [r for r in self.store.calls_since(first) if _covers(which, r)]
            records = [*later, *_unmatched(unstored, later)]
            count = totals.count + len(records)
            successes = totals.successes + sum(r.success for r in records)
            duration_ms = totals.duration_ms + sum(r.duration_ms for r in records)
        else:
            totals = self.store.call_totals(which)
            count, successes, duration_ms = totals.count, totals.successes, totals.duration_ms
        summary = {
            "window": time_range,
            "request_count": count,
            "avg_response_time_ms": round(duration_ms / count, 3) if count else 0.0,
            "requests_per_minute": round(count / (window / 60), 4),
            "error_rate": _share(count - successes, count),
        }
        self._summaries[time_range, which.principal] = (now, summary)
        return dict(summary)

    def _unstored_since(self, since: float) -> list[CallRecord]:
        """The records in memory (not stored yet, or stored a moment ago) at or after a UNIX time."""
        with self._unstored_lock:
            return [r for r in self._unstored.values() if r.timestamp >= since]


def _callers_calls(since: float, techniques: list[str] | None = None) -> CallFilter:
    """The calls the caller sees: everyone's for the local user and admins, a key's own otherwise."""
    caller = current_principal()
    return CallFilter(since, techniques, None if caller is None or caller.admin else caller.id)


class _Calls:
    """Call figures column by column: each group's statistics without a Python object per call."""

    def __init__(self, figures: list[CallFigures]) -> None:
        timestamps, tools, techniques, durations, successes, error_codes, principals = (
            zip(*figures, strict=True) if figures else ((),) * 7
        )
        self.timestamps = np.array(timestamps, dtype=np.float64)
        # In time order, as the mean always summed them.
        self.durations = np.array(durations, dtype=np.float64)
        self.successes = np.array(successes, dtype=np.bool_)
        self.tools: tuple[str, ...] = tools
        self.techniques: tuple[str | None, ...] = techniques
        self.principals = tuple(p or "local" for p in principals)  # the local user's calls (stdio, CLI)
        self.error_codes: tuple[str | None, ...] = error_codes
        self.erring = np.array([i for i, code in enumerate(error_codes) if code], dtype=np.intp)

    def grouped(self, keys: tuple[str | None, ...], window_minutes: float) -> dict[str, Any]:
        """Statistics per key, by name (calls with no key, such as no technique, in none)."""
        groups: dict[str, list[int]] = defaultdict(list)
        for position, key in enumerate(keys):
            if key:
                groups[key].append(position)
        return {
            name: self.stats(np.array(ps, dtype=np.intp), window_minutes)
            for name, ps in sorted(groups.items())
        }

    def stats(self, positions: npt.NDArray[np.intp], window_minutes: float) -> dict[str, Any]:
        """Statistics of one group of calls, by their positions (ascending)."""
        count = len(positions)
        successes = int(np.count_nonzero(self.successes[positions]))
        durations = self.durations[positions]
        p50, p95, p99 = np.percentile(durations, [50, 95, 99]) if count else (0.0, 0.0, 0.0)
        erring = self.erring[np.isin(self.erring, positions)]
        return {
            "request_count": count,
            "success_count": successes,
            "error_count": count - successes,
            "success_rate": _share(successes, count),
            "error_rate": _share(count - successes, count),
            "avg_ms": round(float(durations.mean()), 3) if count else 0.0,
            "p50_ms": round(float(p50), 3),
            "p95_ms": round(float(p95), 3),
            "p99_ms": round(float(p99), 3),
            "requests_per_minute": round(count / window_minutes, 4),
            # By first occurrence, as the codes came.
            "error_codes": dict(Counter(self.error_codes[i] for i in erring)),
            "last_execution_time": _iso(float(self.timestamps[positions].max()), "milliseconds")
            if count
            else None,
        }


def _share(part: int, count: int) -> float:
    return round(part / count, 4) if count else 0.0


def _figures(record: CallRecord) -> CallFigures:
    """A record as the store's call_figures reads it."""
    return (
        record.timestamp,
        record.tool,
        record.technique,
        record.duration_ms,
        record.success,
        record.error_code,
        record.principal,
    )


def _timestamp(figures: CallFigures) -> float:
    return figures[0]


def _covers(which: CallFilter, record: CallRecord) -> bool:
    """Whether a record is one the filter's store read would return."""
    return (
        record.timestamp >= which.since
        and (which.techniques is None or record.technique in which.techniques)
        and (which.principal is None or record.principal == which.principal)
    )


def _unmatched(
    records: list[CallRecord],
    present: Iterable[Hashable],
    as_read: Callable[[CallRecord], Hashable] = lambda record: record,
) -> list[CallRecord]:
    """The records not among those the store read (each one read matches one record)."""
    seen = Counter(present)
    missing = []
    for record in records:
        if seen[as_read(record)] > 0:
            seen[as_read(record)] -= 1
        else:
            missing.append(record)
    return missing


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


def _iso(timestamp: float, timespec: str = "seconds") -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec=timespec)

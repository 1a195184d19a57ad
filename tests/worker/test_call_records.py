"""A call is recorded once, as its caller got it, with the time its caller waited (queue included)."""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import wait
from typing import Any

import orjson

from iris_rag.service import RagService
from iris_rag.worker.dispatch import Dispatcher
from iris_rag.worker.protocol import Request, parse_request
from iris_rag.worker.server import WorkerServer


def _records(service: RagService, request_id: str) -> list[tuple[str | None, int]]:
    service.monitor.flush()
    recent = service.metrics({"time_range": "1h"})["recent_calls"]
    return [(c["error_code"], round(c["duration_ms"] / 100)) for c in recent if c["request_id"] == request_id]


def _held_until(release: threading.Event) -> Any:
    def handler(_params: dict[str, Any]) -> dict[str, Any]:
        release.wait(30)
        return {"documents": []}

    return handler


def test_a_timed_out_call_is_recorded_when_its_caller_is_answered_with_the_time_it_waited(
    service: RagService,
) -> None:
    """It was missing until the work ended (never, for a hung one), then recorded with the work's time."""
    release = threading.Event()
    dispatcher = Dispatcher(service)
    dispatcher.methods["list_documents"] = _held_until(release)
    server = WorkerServer(dispatcher, io.BytesIO(), work_threads=2)
    taken = time.time() - 4.0  # the front end took both calls 4 s ago and answered them just now
    server.submit(Request("slow", "list_documents", {"request_id": "to1"}, sent_at=taken))
    server.submit(Request("gone", "list_documents", {"request_id": "cx1"}, sent_at=taken))
    server.cancel(Request("c1", "cancel", {"request_id": "slow", "reason": "timeout"}, sent_at=taken + 4.0))
    server.cancel(Request("c2", "cancel", {"request_id": "gone", "reason": "client"}, sent_at=taken + 4.0))
    assert _records(service, "to1") == [("TIMEOUT_EXCEEDED", 40)]
    assert _records(service, "cx1") == [("REQUEST_CANCELLED", 40)]
    release.set()  # the work ends later: not recorded a second time
    wait(list(server.running), timeout=30)
    assert _records(service, "to1") == [("TIMEOUT_EXCEEDED", 40)]
    assert _records(service, "cx1") == [("REQUEST_CANCELLED", 40)]


def test_a_call_is_recorded_with_the_time_it_queued_before_it_ran(service: RagService) -> None:
    """Three calls with MAX_CONCURRENT_REQUESTS=1 waited 6, 12 and 18 s; each was recorded as 6 s."""
    line = orjson.dumps(
        {
            "id": "q",
            "method": "list_documents",
            "params": {"request_id": "q1"},
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - 6)),
        }
    )
    request = parse_request(line)
    assert request.sent_at is not None and abs(time.time() - 6 - request.sent_at) < 1.5
    dispatcher = Dispatcher(service)
    dispatcher.methods["list_documents"] = lambda _params: {"documents": []}
    server = WorkerServer(dispatcher, io.BytesIO(), work_threads=1)
    server.answer(Request("q", "list_documents", {"request_id": "q1"}, sent_at=time.time() - 6.0))
    assert _records(service, "q1") == [(None, 60)]

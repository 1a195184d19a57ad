"""The worker driven as the front end drives it: a subprocess speaking JSON lines."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import DOCUMENTS, ROOT


class WorkerProcess:
    """`python -m iris_rag.bridge` with a thread collecting its stdout lines in arrival order."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "RAG_DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING", **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "iris_rag.bridge"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.raw_lines: list[bytes] = []
        self.events: list[dict[str, Any]] = []
        self.responses: queue.Queue[dict[str, Any]] = queue.Queue()
        self.order: list[Any] = []
        threading.Thread(target=self._read, daemon=True).start()
        self._next = 0

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.raw_lines.append(line)
            message = orjson.loads(line)  # a non-JSON line fails the test through all_lines_are_json
            if "event" in message:  # the ready line or a progress event, not an answer
                self.events.append(message)
                continue
            self.order.append(message["id"])
            self.responses.put(message)

    def next_id(self) -> str:
        self._next += 1
        return f"r{self._next}"

    def send(self, method: str, params: dict[str, Any] | None = None, raw: bytes | None = None) -> str:
        request_id = self.next_id()
        line = (
            raw
            if raw is not None
            else orjson.dumps({"id": request_id, "method": method, "params": params or {}})
        )
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()
        return request_id

    def wait_for(self, request_id: Any, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        pending: list[dict[str, Any]] = []
        try:
            while time.monotonic() < deadline:
                try:
                    message = self.responses.get(timeout=0.1)
                except queue.Empty:
                    continue
                if message["id"] == request_id:
                    return message
                pending.append(message)
            raise TimeoutError(request_id)
        finally:
            for message in pending:
                self.responses.put(message)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.wait_for(self.send(method, params))

    def all_lines_are_json(self) -> bool:
        return all(isinstance(orjson.loads(line), dict) for line in self.raw_lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    process = WorkerProcess(tmp_path / "data")
    yield process
    process.stop()


def test_describe_and_health_answer_while_the_model_loads(worker: WorkerProcess) -> None:
    slow = worker.send("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
    describe = worker.send("describe")
    health = worker.send("health_check", {"include_details": True})
    described = worker.wait_for(describe, timeout=30)
    assert {t["name"] for t in described["result"]["tools"]} >= {
        "rag_basic",
        "rag_ingest",
        "rag_health_check",
    }
    health_result = worker.wait_for(health, timeout=30)["result"]
    assert health_result["components"]["embedding_service"]["details"]["state"] == "loading"
    assert health_result["status"] == "degraded"
    ingested = worker.wait_for(slow)
    assert ingested["success"] and ingested["result"]["ingested_count"] == 3
    # Answered out of order: the later describe and health came back before the ingest.
    assert worker.order.index(describe) < worker.order.index(slow)
    assert worker.order.index(health) < worker.order.index(slow)
    assert worker.all_lines_are_json()


def test_an_ingest_reports_its_steps_before_its_answer(worker: WorkerProcess) -> None:
    ingest = worker.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})
    assert ingest["success"]
    steps = [event for event in worker.events if event["event"] == "progress" and event["id"] == ingest["id"]]
    progress = [event["progress"] for event in steps]
    assert len(steps) >= 3 and progress == sorted(set(progress)), steps
    messages = [event["message"] for event in steps]
    assert any(m.startswith("embedding 3 chunks of 3 documents") for m in messages), messages
    assert messages[-1] == "committing"
    assert not any(event["event"] == "progress" for event in worker.events if event["id"] != ingest["id"])


def test_full_session_and_bad_input(worker: WorkerProcess) -> None:
    bad_line = worker.send("", raw=b"{this is not json")
    assert bad_line
    malformed = worker.wait_for(None, timeout=30)
    assert malformed["error"]["code"] == "MALFORMED_REQUEST"
    assert worker.call("describe")["success"], "the worker survived the malformed line"

    assert worker.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})["success"]
    duplicate = worker.call(
        "ingest",
        {
            "collection_id": "docs",
            "documents": [{"id": "x", "content": "one"}, {"id": "x", "content": "two"}],
        },
    )
    assert duplicate["result"]["errors"][0]["code"] == "DUPLICATE_DOCUMENT_ID"

    answer = worker.call(
        "execute", {"technique": "basic", "arguments": {"query": "volcano lava", "collection_id": "docs"}}
    )
    assert answer["success"]
    assert answer["result"]["retrieved_documents"][0]["id"] == "volcano"

    def code(method: str, params: dict[str, Any]) -> str:
        response = worker.call(method, params)
        assert response["success"] is False
        return str(response["error"]["code"])

    def basic(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"technique": "basic", "arguments": {"collection_id": "docs", **arguments}}

    assert code("execute", basic({"query": ""})) == "INVALID_QUERY"
    assert code("execute", basic({"query": "   "})) == "INVALID_QUERY"
    assert code("execute", basic({"query": "q" * 2049})) == "INVALID_QUERY"
    for top_k in (0, 51, "5"):
        assert code("execute", basic({"query": "q", "options": {"top_k": top_k}})) == "INVALID_PARAMETERS"
    assert code("execute", basic({"query": "q", "options": {"bogus": True}})) == "INVALID_PARAMETERS"
    assert code("execute", {"technique": "basic", "arguments": {"query": "q", "collection_id": "nope"}}) == (
        "COLLECTION_NOT_FOUND"
    )
    assert code("execute", {"technique": "telepathy", "arguments": {"query": "q"}}) == "PIPELINE_NOT_FOUND"
    assert code("get_document", {"document_id": "missing", "collection_id": "docs"}) == "DOCUMENT_NOT_FOUND"
    assert code("no_such_method", {}) == "METHOD_NOT_FOUND"

    listed = worker.call("list_collections")["result"]["collections"]
    assert [(c["id"], c["document_count"]) for c in listed] == [("docs", 4)], "no bad call lost or added data"
    metrics = worker.call("metrics", {"time_range": "1h"})["result"]
    assert metrics["by_technique"]["basic"]["request_count"] >= 8
    assert metrics["by_technique"]["basic"]["error_codes"]["INVALID_QUERY"] == 3

    shutdown = worker.call("shutdown")
    assert shutdown["result"] == {"shutting_down": True}
    assert worker.process.wait(timeout=30) == 0
    assert worker.all_lines_are_json()


def test_shutdown_during_a_long_request_exits_cleanly_and_keeps_stored_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = WorkerProcess(data)
    assert first.call("ingest", {"collection_id": "docs", "documents": DOCUMENTS})["success"]
    big = [{"id": f"bulk-{i}", "content": f"Bulk document {i}. " * 200} for i in range(300)]
    first.send("ingest", {"collection_id": "docs", "documents": big})
    for _ in range(8):
        first.send(
            "execute", {"technique": "crag", "arguments": {"query": "aspirin", "collection_id": "docs"}}
        )
    time.sleep(1.0)
    first.send("shutdown")
    # The ingest outlasts the grace period: the worker must exit on its own, and not by a crash.
    assert first.process.wait(timeout=30) == 0

    second = WorkerProcess(data)
    try:
        collections = second.call("list_collections")["result"]["collections"]
        count = next(c["document_count"] for c in collections if c["id"] == "docs")
        assert count in (3, 303), "the interrupted ingest is all or nothing"
    finally:
        second.stop()


def _bulk(count: int, prefix: str = "bulk") -> list[dict[str, str]]:
    return [{"id": f"{prefix}-{i}", "content": f"Bulk document {i}. " * 200} for i in range(count)]


def test_announces_that_it_is_ready(worker: WorkerProcess) -> None:
    assert worker.call("describe")["success"]
    first = orjson.loads(worker.raw_lines[0])
    assert first == {"id": None, "event": "ready", "pid": worker.process.pid}


def test_unreadable_lines_are_answered_with_their_id(worker: WorkerProcess) -> None:
    # A lone surrogate (orjson refuses it) and nesting past orjson's depth limit: the rest of the line
    # cannot be read, but the id at its start can, so the call that sent it is answered at once.
    surrogate = worker.send(
        "", raw=b'{"id":"lone","method":"execute","params":{"query":"insulin \\ud800 x"}}'
    )
    deep = b'{"id":"deep","method":"ingest","params":{"m":' + b"[" * 5000 + b"]" * 5000 + b"}}"
    worker.send("", raw=deep)
    numeric = worker.send("", raw=b'{"id": 42, "method": "describe", "params": {"x": "\\udc00"}}')
    assert surrogate and numeric
    for request_id in ("lone", "deep", 42):
        answer = worker.wait_for(request_id, timeout=10)
        assert answer["success"] is False
        assert answer["error"]["code"] == "MALFORMED_REQUEST"
    assert worker.call("describe")["success"]
    assert worker.all_lines_are_json()


def test_a_cancelled_request_that_waits_for_a_thread_never_runs(tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path / "data", {"WORKER_THREADS": "1"})
    try:
        slow = worker.send("ingest", {"collection_id": "first", "documents": _bulk(20)})
        waiting = worker.send("ingest", {"collection_id": "cancelled", "documents": DOCUMENTS})
        timed_out = worker.send("ingest", {"collection_id": "timed-out", "documents": DOCUMENTS})
        cancel = worker.call("cancel", {"request_id": waiting})
        assert cancel["result"] == {"cancelled": True}
        worker.call("cancel", {"request_id": timed_out, "reason": "timeout"})
        assert worker.call("cancel", {"request_id": "no-such-request"})["result"] == {"cancelled": False}

        assert worker.wait_for(waiting)["error"]["code"] == "REQUEST_CANCELLED"
        assert worker.wait_for(timed_out)["error"]["code"] == "REQUEST_CANCELLED"
        assert worker.wait_for(slow)["success"]
        listed = worker.call("list_collections")["result"]["collections"]
        assert [c["id"] for c in listed] == ["first"], "the cancelled ingests wrote nothing"
        # Each is recorded once, as the client saw it: a time-out as TIMEOUT_EXCEEDED.
        metrics = worker.call("metrics", {"time_range": "1h"})["result"]
        assert metrics["by_tool"]["rag_ingest"]["error_codes"] == {
            "REQUEST_CANCELLED": 1,
            "TIMEOUT_EXCEEDED": 1,
        }
    finally:
        worker.stop()


def test_never_accepts_more_work_than_max_concurrent_requests(tmp_path: Path) -> None:
    worker = WorkerProcess(tmp_path / "data", {"MAX_CONCURRENT_REQUESTS": "1"})
    try:
        slow = worker.send("ingest", {"collection_id": "first", "documents": _bulk(20)})
        refused = worker.wait_for(
            worker.send("ingest", {"collection_id": "second", "documents": DOCUMENTS}), 10
        )
        assert refused["error"]["code"] == "RATE_LIMIT_EXCEEDED"
        # Control methods have their own lane and are not counted.
        assert worker.call("describe")["success"]
        assert worker.wait_for(slow)["success"]
        assert worker.call("ingest", {"collection_id": "second", "documents": DOCUMENTS})["success"]
    finally:
        worker.stop()

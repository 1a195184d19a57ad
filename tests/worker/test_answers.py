"""Every admitted request gets an answer line, even when its result cannot be encoded."""

from __future__ import annotations

import io
import math
import re
import threading
import time
from pathlib import Path

import orjson

from iris_rag.service import RagService
from iris_rag.worker.dispatch import Dispatcher
from iris_rag.worker.protocol import MAX_ANSWER_BYTES, Request
from iris_rag.worker.server import WorkerServer


def test_a_result_that_cannot_be_encoded_is_answered_as_an_internal_error(service: RagService) -> None:
    dispatcher = Dispatcher(service)
    # A method whose result orjson refuses (an integer past 64 bits), as a store once returned one.
    dispatcher.methods["too_big"] = lambda _params: {"n": 10**20}
    output = io.BytesIO()
    server = WorkerServer(dispatcher, output, work_threads=1)
    server.answer(Request(7, "too_big", {}))
    answer = orjson.loads(output.getvalue())
    assert answer["id"] == 7 and answer["success"] is False
    assert (
        answer["error"]["code"] == "INTERNAL_ERROR" and "could not be encoded" in answer["error"]["message"]
    )


def test_an_answer_past_the_line_cap_is_answered_as_result_too_large(service: RagService) -> None:
    """Whatever tool made it, no answer line is over MAX_ANSWER_BYTES: the front end reads lines whole."""
    dispatcher = Dispatcher(service)
    dispatcher.methods["huge"] = lambda _params: {"blob": "x" * MAX_ANSWER_BYTES}
    dispatcher.methods["small"] = lambda _params: {"blob": "x"}
    output = io.BytesIO()
    server = WorkerServer(dispatcher, output, work_threads=1)
    server.answer(Request("big", "huge", {}))
    line = output.getvalue()
    assert len(line) <= MAX_ANSWER_BYTES and line.endswith(b"\n")
    answer = orjson.loads(line)
    assert answer["id"] == "big" and answer["success"] is False
    assert answer["error"]["code"] == "RESULT_TOO_LARGE"
    assert answer["error"]["details"]["max_bytes"] == MAX_ANSWER_BYTES
    assert answer["error"]["details"]["bytes"] > MAX_ANSWER_BYTES
    server.answer(Request("next", "small", {}))
    assert orjson.loads(output.getvalue()[len(line) :])["result"] == {"blob": "x"}


def test_an_answer_that_could_not_go_out_is_recorded_as_the_failure_the_caller_got(
    service: RagService,
) -> None:
    """The call record was written before the answer was encoded: rag_metrics counted it a success."""
    dispatcher = Dispatcher(service)
    dispatcher.methods["get_document"] = lambda _params: {"blob": "x" * MAX_ANSWER_BYTES}
    dispatcher.methods["list_documents"] = lambda _params: {"n": 10**20}
    server = WorkerServer(dispatcher, io.BytesIO(), work_threads=1)
    server.answer(Request("big", "get_document", {"request_id": "r-big"}))
    server.answer(Request("odd", "list_documents", {}))
    service.monitor.flush()
    by_tool = service.metrics({"time_range": "1h"})["by_tool"]
    too_large, unencodable = by_tool["rag_get_document"], by_tool["rag_list_documents"]
    assert (too_large["error_count"], too_large["error_codes"]) == (1, {"RESULT_TOO_LARGE": 1})
    assert (unencodable["error_count"], unencodable["error_codes"]) == (1, {"INTERNAL_ERROR": 1})
    recent = service.metrics({"time_range": "1h"})["recent_calls"]
    assert any(c["request_id"] == "r-big" and c["success"] is False for c in recent)


def test_the_front_end_reads_every_answer_line_the_worker_may_write() -> None:
    source = (Path(__file__).resolve().parents[2] / "mcp-server" / "src" / "bridge.ts").read_text(
        encoding="utf-8"
    )
    match = re.search(r"export const MAX_ANSWER_BYTES = ([\d_ *]+);", source)
    assert match, "bridge.ts defines MAX_ANSWER_BYTES"
    assert math.prod(int(factor) for factor in match.group(1).replace("_", "").split("*")) == MAX_ANSWER_BYTES


def test_a_second_request_with_the_id_of_one_in_flight_is_refused_and_both_are_answered(
    service: RagService,
) -> None:
    """Its answer could never be told from the first's (and its run lost track of the id): refused at once."""
    dispatcher = Dispatcher(service)
    release = threading.Event()
    dispatcher.methods["get_document"] = lambda _params: {"done": release.wait(10)}
    output = io.BytesIO()
    server = WorkerServer(dispatcher, output, work_threads=2)
    lines = [orjson.dumps({"id": 5, "method": "get_document", "params": {}}) + b"\n"] * 2
    serving = threading.Thread(target=server.serve, args=(io.BytesIO(b"".join(lines)),))
    serving.start()
    deadline = time.monotonic() + 10
    while b"MALFORMED_REQUEST" not in output.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    serving.join(10)
    answers = [orjson.loads(line) for line in output.getvalue().splitlines()]
    assert [(a["id"], a["success"]) for a in answers] == [(5, False), (5, True)]
    assert answers[0]["error"]["code"] == "MALFORMED_REQUEST"
    assert (
        answers[0]["error"]["message"] == "request id 5 is already in flight; each request needs its own id"
    )
    assert answers[1]["result"] == {"done": True}

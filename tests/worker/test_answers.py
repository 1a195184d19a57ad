"""Every admitted request gets an answer line, even when its result cannot be encoded."""

from __future__ import annotations

import io
import math
import re
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


def test_the_front_end_reads_every_answer_line_the_worker_may_write() -> None:
    source = (Path(__file__).resolve().parents[2] / "mcp-server" / "src" / "bridge.ts").read_text(
        encoding="utf-8"
    )
    match = re.search(r"export const MAX_ANSWER_BYTES = ([\d_ *]+);", source)
    assert match, "bridge.ts defines MAX_ANSWER_BYTES"
    assert math.prod(int(factor) for factor in match.group(1).replace("_", "").split("*")) == MAX_ANSWER_BYTES

"""Every admitted request gets an answer line, even when its result cannot be encoded."""

from __future__ import annotations

import io

import orjson

from iris_rag.service import RagService
from iris_rag.worker.dispatch import Dispatcher
from iris_rag.worker.protocol import Request
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

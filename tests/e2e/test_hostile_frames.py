"""Issue 11's hostile frames, written raw to the real server: each is answered at once and it stays up."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.raw_server import RawServer

pytestmark = pytest.mark.e2e

PROMPT_S = 10  # "answered at once": far below REQUEST_TIMEOUT_MS, which is what a lost answer waits for
SLOW_S = 240  # an ingest while the embedding model loads, on a busy machine


def _slow_documents(count: int = 12) -> list[dict[str, str]]:
    text = "Retrieval-augmented generation grounds answers in retrieved text. " * 60
    return [{"id": f"doc-{i}", "content": f"Document {i}. {text}"} for i in range(count)]


@pytest.fixture
def server(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], tmp_path: Path
) -> Iterator[RawServer]:
    # One call at a time: a second call waits for a slot, which is where a deep frame used to kill Node.
    # A cancelled call keeps its slot until the worker really stops it (no grace period frees it early).
    limits = {"MAX_CONCURRENT_REQUESTS": "1", "REQUEST_TIMEOUT_MS": "600000", "CANCEL_GRACE_MS": "600000"}
    env = {**server_env, **limits, "RAG_DATA_DIR": str(tmp_path / "data")}
    raw = RawServer(repo_root, server_entry, env)
    yield raw
    raw.close()


def _deep(depth: int) -> str:
    return '{"m":' * depth + "1" + "}" * depth


def test_deep_metadata_and_lone_surrogates_are_refused_at_once(server: RawServer) -> None:
    slow = server.call_tool("rag_ingest", {"collection_id": "slow", "documents": _slow_documents()})
    time.sleep(0.5)  # the ingest holds the only slot
    frames = {
        # Defect 1: metadata nested 5,000 deep, waiting for a slot.
        "deep_5000": (
            '{"collection_id":"c","documents":[{"content":"x","metadata":' + _deep(5000) + "}]}",
            "rag_ingest",
            "INVALID_PARAMETERS",
        ),
        # Defect 2: deeper than the worker's JSON parser reads (1,024), shallower than Node's stack.
        "deep_1100": (
            '{"collection_id":"c","documents":[{"content":"x","metadata":' + _deep(1100) + "}]}",
            "rag_ingest",
            "INVALID_PARAMETERS",
        ),
        # Defect 2: a lone surrogate, in the query and elsewhere.
        "surrogate_query": ('{"query":"insulin \\ud800 x"}', "rag_basic", "INVALID_QUERY"),
        "surrogate_filter": (
            '{"query":"q","options":{"filters":{"f":"\\udc00"}}}',
            "rag_hybrid_ifind",
            "INVALID_PARAMETERS",
        ),
    }
    ids = {}
    for name, (arguments, tool, _code) in frames.items():
        ids[name] = server.next_id()
        server.send_line(
            f'{{"jsonrpc":"2.0","id":{ids[name]},"method":"tools/call",'
            f'"params":{{"name":"{tool}","arguments":{arguments}}}}}'
        )
    for name, (_arguments, _tool, code) in frames.items():
        is_error, body = server.tool_body(ids[name], timeout=PROMPT_S)
        assert is_error, name
        assert body["error"]["code"] == code, (name, body)
        assert body["hint"]
    assert server.alive()
    is_error, body = server.tool_body(slow, timeout=SLOW_S)
    assert not is_error and body["ingested_count"] == 12, body


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (None, "params must be an object"),
        ({"name": "rag_basic", "arguments": []}, "arguments must be a JSON object"),
        ({"name": "rag_basic", "arguments": "q"}, "arguments must be a JSON object"),
        ({"name": "rag_basic", "arguments": 5}, "arguments must be a JSON object"),
        ({"arguments": {"query": "q"}}, "needs params.name"),
    ],
)
def test_malformed_tools_call_params_get_a_prompt_invalid_params_error(
    server: RawServer, params: Any, expected: str
) -> None:
    answer = server.wait(server.request("tools/call", params), timeout=PROMPT_S)
    assert answer["error"]["code"] == -32602, answer
    assert expected in answer["error"]["message"]
    assert "invalid_type" not in answer["error"]["message"], "a clear message, not a zod dump"
    assert server.alive()


def test_unparseable_frames_are_answered_and_the_server_stays_up(server: RawServer) -> None:
    server.send_line("{this is not json")
    assert server.wait(None, timeout=PROMPT_S)["error"]["code"] == -32700
    server.send_line("[1, 2]")
    assert server.wait(None, timeout=PROMPT_S)["error"]["code"] == -32600
    listed = server.wait(server.request("tools/list", {}), timeout=PROMPT_S)
    assert {tool["name"] for tool in listed["result"]["tools"]} >= {"rag_basic", "rag_ingest"}
    assert all(isinstance(json.loads(line), dict) for line in server.stdout_lines)


def test_a_cancelled_call_is_never_answered_and_a_queued_one_never_runs(server: RawServer) -> None:
    slow = server.call_tool("rag_ingest", {"collection_id": "slow", "documents": _slow_documents()})
    queued = server.call_tool("rag_ingest", {"collection_id": "cancelled", "documents": _slow_documents(2)})
    time.sleep(0.5)
    cancel = {"requestId": queued, "reason": "changed my mind"}
    server.send_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}))
    is_error, body = server.tool_body(slow, timeout=SLOW_S)
    assert not is_error, body
    with pytest.raises(TimeoutError):
        server.wait(queued, timeout=2)  # per MCP, no response after a cancel
    _, listed = server.tool_body(server.call_tool("rag_list_collections", {}), timeout=PROMPT_S)
    assert [c["id"] for c in listed["collections"]] == ["slow"], "the cancelled ingest wrote nothing"
    _, metrics = server.tool_body(server.call_tool("rag_metrics", {"time_range": "1h"}), timeout=PROMPT_S)
    assert metrics["by_tool"]["rag_ingest"]["error_codes"] == {"REQUEST_CANCELLED": 1}


def test_a_running_ingest_cancelled_by_the_client_stops_and_writes_nothing(server: RawServer) -> None:
    # Big enough to run for minutes with every technique's index; a cancel must stop it at its next slice.
    documents = _slow_documents(120)
    ingest = server.call_tool("rag_ingest", {"collection_id": "cancelled", "documents": documents})
    time.sleep(3)  # the worker has it: loading the model or encoding
    cancel = {"requestId": ingest, "reason": "the user pressed stop"}
    server.send_line(json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}))
    # The only slot (MAX_CONCURRENT_REQUESTS=1) is freed when the worker stops the ingest, not before.
    probe = server.call_tool("rag_basic", {"query": "q", "collection_id": "cancelled"})
    is_error, body = server.tool_body(probe, timeout=60)
    assert is_error and body["error"]["code"] == "COLLECTION_NOT_FOUND", body
    with pytest.raises(TimeoutError):
        server.wait(ingest, timeout=1)  # per MCP, no response after a cancel
    _, listed = server.tool_body(server.call_tool("rag_list_collections", {}), timeout=PROMPT_S)
    assert listed["collections"] == [], "a cancelled first ingest leaves no collection behind"
    _, metrics = server.tool_body(server.call_tool("rag_metrics", {"time_range": "1h"}), timeout=PROMPT_S)
    assert metrics["by_tool"]["rag_ingest"]["error_codes"] == {"REQUEST_CANCELLED": 1}

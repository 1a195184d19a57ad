"""Fuzz the real Node server as hostile and careless clients would: generated tool calls and raw frames.

Part one drives `node mcp-server/dist/index.js` with the official Python MCP client: at least 2,000 calls
generated from the served inputSchemas (Hypothesis, derandomized so CI is reproducible), valid and invalid
(see fuzz_strategies for what valid means). Part two writes raw JSON-RPC frames to the server's stdin.
Every call must be answered within CALL_LIMIT_S, invalid input always as an isError result or a JSON-RPC
error, valid input never refused as INVALID_PARAMETERS/INVALID_QUERY, no traceback in any answer, nothing
but protocol on stdout, and the server (and its one worker) alive at the end. Findings are collected by
class and reported together, so one run shows every failure class at once.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mcp import McpError, StdioServerParameters
from mcp.types import CallToolResult, TextContent, Tool

from iris_rag.schemas import tool_specs
from tests.e2e.fuzz_strategies import (
    FUZZ_COLLECTION,
    REFUSAL_CODES,
    SERVER_FAILURE_CODES,
    conforms,
    invalid_arguments,
    refusal_documented,
    valid_arguments,
)
from tests.e2e.mcp_harness import WORKER_STARTED, ClientThread, RawServer

pytestmark = [pytest.mark.e2e]

CALL_LIMIT_S = 10
# Generated calls per tool: (valid, invalid). Fewer valid calls for the slow techniques and the writers;
# invalid calls are refused before any work, so every tool gets many.
EXAMPLES = {
    "rag_hyde": (20, 100),
    "rag_graphrag": (20, 100),
    "rag_graph_explore": (20, 100),
    "rag_ingest": (12, 100),
    "rag_ingest_table": (12, 100),
}
DEFAULT_EXAMPLES = (40, 100)
MIN_GENERATED_CALLS = 2000
DOCUMENTS = [
    {
        "id": "seine",
        "title": "Paris",
        "content": "Paris is the capital of France. The Seine flows through it.",
    },
    {
        "id": "photosynthesis",
        "title": "Plants",
        "content": "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar.",
        "metadata": {"year": 2020, "topic": "biology"},
    },
    {"id": "python", "title": "Python", "content": "Python is a programming language with readable syntax."},
]
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\n\s+at .+:\d+:\d+\)?|File \".+\", line \d+")


class Findings:
    """Failures grouped by class, a few examples each, reported together at the end."""

    def __init__(self) -> None:
        self.by_class: dict[str, list[str]] = defaultdict(list)
        self.calls = 0

    def add(self, kind: str, example: str) -> None:
        self.by_class[kind].append(example[:400])

    def report(self) -> str:
        return "\n".join(
            f"- {kind}: {len(examples)} calls, e.g. {examples[:8]}"
            for kind, examples in sorted(self.by_class.items())
        )


def _short(arguments: Any) -> str:
    text = json.dumps(arguments, ensure_ascii=True, default=str)
    return text if len(text) < 200 else text[:200] + "..."


def _body(result: CallToolResult) -> tuple[str, dict[str, Any] | None]:
    text = "".join(c.text for c in result.content if isinstance(c, TextContent))
    try:
        parsed = json.loads(text)
    except ValueError:
        return text, None
    return text, parsed if isinstance(parsed, dict) else None


def check_call(client: ClientThread, findings: Findings, tool: Tool, arguments: dict[str, Any]) -> None:
    """One generated call, classified by the schema, its answer checked against what it deserves."""
    valid = conforms(tool.inputSchema, arguments)
    findings.calls += 1
    what = f"{tool.name} {_short(arguments)}"
    try:
        result = client.call_tool(tool.name, arguments, timeout=CALL_LIMIT_S)
    except TimeoutError:
        findings.add(f"no answer within {CALL_LIMIT_S} s", what)
        return
    except McpError as exc:
        if TRACEBACK.search(str(exc.error.message)):
            findings.add("traceback in a JSON-RPC error", f"{what} -> {exc.error.message}")
        if valid:
            findings.add("valid input refused with a JSON-RPC error", f"{what} -> {exc.error.message}")
        return
    except RuntimeError as exc:  # the client checks structuredContent against the tool's outputSchema
        findings.add("result does not match the tool's outputSchema", f"{what} -> {exc}")
        return
    text, body = _body(result)
    if TRACEBACK.search(text):
        findings.add("traceback in a result", f"{what} -> {text[:300]}")
    if not result.isError:
        if not valid:
            findings.add("invalid input accepted", what)
        return
    error = (body or {}).get("error")
    if not isinstance(error, dict) or "code" not in error:
        findings.add("isError result without an error code", f"{what} -> {text[:200]}")
        return
    if error["code"] in SERVER_FAILURE_CODES:
        findings.add(f"server failure {error['code']}", f"{what} -> {error.get('message')}")
    if valid and error["code"] in REFUSAL_CODES and not refusal_documented(tool.name, arguments, error):
        findings.add(f"valid input refused as {error['code']}", f"{what} -> {error.get('message')}")


def _server_params(server_entry: Path, repo_root: Path, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command="node", args=[str(server_entry)], env=env, cwd=repo_root)


@pytest.fixture(scope="module")
def fuzz_env(server_env: dict[str, str]) -> dict[str, str]:
    """Every technique served (the default), no LLM, the fuzz collection as the default one."""
    env = {**server_env, "RAG_DEFAULT_COLLECTION": FUZZ_COLLECTION, "LLM_PROVIDER": "none"}
    env.pop("RAG_TECHNIQUES", None)
    env.pop("MAX_CONCURRENT_REQUESTS", None)
    return env


@pytest.fixture(scope="module")
def client(
    repo_root: Path, server_entry: Path, fuzz_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ClientThread, Path]]:
    stderr_path = tmp_path_factory.mktemp("fuzz-client") / "server.stderr"
    with stderr_path.open("w") as stderr:
        thread = ClientThread(_server_params(server_entry, repo_root, fuzz_env), stderr)
        try:
            ingested = thread.call_tool(
                "rag_ingest", {"collection_id": FUZZ_COLLECTION, "documents": DOCUMENTS}, timeout=180
            )
            assert not ingested.isError, ingested.content
            yield thread, stderr_path
        finally:
            thread.close()


def test_generated_tool_calls_are_answered_and_judged_right(client: tuple[ClientThread, Path]) -> None:
    thread, stderr_path = client
    findings = Findings()
    # Generated from the full schemas the server validates against; tools/list shows a lighter form of them.
    full = {spec["name"]: spec["inputSchema"] for spec in tool_specs()}
    tools = [tool.model_copy(update={"inputSchema": full[tool.name]}) for tool in thread.list_tools()]
    assert tools, "the server lists its tools"
    for tool in sorted(tools, key=lambda t: t.name):
        valid_count, invalid_count = EXAMPLES.get(tool.name, DEFAULT_EXAMPLES)
        for count, strategy in (
            (valid_count, valid_arguments(tool.name, tool.inputSchema)),
            (invalid_count, invalid_arguments(tool.name, tool.inputSchema)),
        ):
            run_generated(thread, findings, tool, strategy, count)

    health = thread.call_tool("rag_health_check", {"include_details": True}, timeout=CALL_LIMIT_S)
    _, body = _body(health)
    assert not health.isError and body is not None, "the server is alive after the fuzzing"
    assert body["components"]["python_bridge"]["status"] == "healthy"
    starts = stderr_path.read_text(errors="replace").count(WORKER_STARTED)
    assert starts == 1, f"the worker was started {starts} times: it crashed or was restarted"
    assert thread.stray_output == [], "only protocol on stdout"
    assert not findings.by_class, f"{findings.calls} generated calls; failures:\n{findings.report()}"
    assert findings.calls >= MIN_GENERATED_CALLS


def run_generated(
    thread: ClientThread,
    findings: Findings,
    tool: Tool,
    strategy: st.SearchStrategy[dict[str, Any]],
    count: int,
) -> None:
    """`count` derandomized examples of the strategy, each one call; no shrinking (findings are kept)."""

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(arguments=strategy)
    def one_call(arguments: dict[str, Any]) -> None:
        check_call(thread, findings, tool, arguments)

    one_call()


# Raw frames ---------------------------------------------------------------------------------------------
DEEP = 5000


def _deep_object(depth: int) -> str:
    """JSON text nested `depth` objects deep (built as text: Python's encoder would recurse too deep)."""
    return '{"a":' * depth + "1" + "}" * depth


def _request(request_id: str, method: str, params: Any = None, *, raw_params: str | None = None) -> bytes:
    if raw_params is not None:
        return f'{{"jsonrpc":"2.0","id":"{request_id}","method":"{method}","params":{raw_params}}}'.encode()
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    # ensure_ascii writes a lone surrogate as the escape \ud800, exactly what a careless client sends.
    return json.dumps(message).encode()


def _tool_call(request_id: str, name: str, arguments: Any) -> bytes:
    return _request(request_id, "tools/call", {"name": name, "arguments": arguments})


def _raw_tool_call(request_id: str, name: str, raw_arguments: str) -> bytes:
    return _request(request_id, "tools/call", raw_params=f'{{"name":"{name}","arguments":{raw_arguments}}}')


# What each frame deserves: "refused" (a JSON-RPC error or an isError result), "invalid_params" (-32602 or
# an isError INVALID_PARAMETERS: issue 11 defect 3), "answered" (any response), None (a frame without a
# usable id: no response is owed, the server must simply go on answering).
RAW_FRAMES: list[tuple[str, bytes, tuple[str, ...], str | None]] = [
    ("truncated JSON", b'{"jsonrpc":"2.0","id":"x1","method":"tools/call","params":', (), None),
    ("not JSON", b"this is not json {", (), None),
    ("JSON null", b"null", (), None),
    ("JSON number", b"42", (), None),
    ("JSON string", b'"tools/list"', (), None),
    ("empty batch", b"[]", (), None),
    ("id of a wrong type", b'{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}', (), None),
    ("wrong jsonrpc version", b'{"jsonrpc":"1.0","id":"v1","method":"ping"}', (), None),
    (
        "tool name not a string",
        _request("t1", "tools/call", {"name": 123, "arguments": {}}),
        ("t1",),
        "refused",
    ),
    ("query not a string", _tool_call("t2", "rag_basic", {"query": 5}), ("t2",), "refused"),
    ("unknown tool", _tool_call("t3", "rag_no_such_tool", {}), ("t3",), "refused"),
    ("params null", _request("p1", "tools/call", raw_params="null"), ("p1",), "invalid_params"),
    ("params missing", _request("p2", "tools/call"), ("p2",), "invalid_params"),
    ("params an array", _request("p3", "tools/call", raw_params="[1,2]"), ("p3",), "invalid_params"),
    ("arguments an array", _raw_tool_call("a1", "rag_basic", "[1,2]"), ("a1",), "invalid_params"),
    ("arguments a string", _raw_tool_call("a2", "rag_basic", '"insulin"'), ("a2",), "invalid_params"),
    ("arguments a number", _raw_tool_call("a3", "rag_basic", "7"), ("a3",), "invalid_params"),
    ("arguments null", _raw_tool_call("a4", "rag_basic", "null"), ("a4",), "refused"),
    (
        "lone high surrogate in a query",
        _tool_call("s1", "rag_basic", {"query": "insulin \ud800 x"}),
        ("s1",),
        "answered",
    ),
    (
        "lone low surrogate in a query",
        _tool_call("s2", "rag_hyde", {"query": "\udc00 insulin"}),
        ("s2",),
        "answered",
    ),
    (
        "lone surrogate in a document",
        _tool_call("s3", "rag_ingest", {"collection_id": "raw", "documents": [{"content": "a \ud800 b"}]}),
        ("s3",),
        "answered",
    ),
    (
        "lone surrogate in a metadata key",
        _tool_call(
            "s4",
            "rag_ingest",
            {"collection_id": "raw", "documents": [{"content": "x", "metadata": {"\udbff": 1}}]},
        ),
        ("s4",),
        "answered",
    ),
    ("lone surrogate in a tool name", _tool_call("s5", "rag_\ud800", {}), ("s5",), "refused"),
    (
        f"metadata nested {DEEP} deep",
        _raw_tool_call(
            "d1",
            "rag_ingest",
            f'{{"collection_id":"raw","documents":[{{"content":"x","metadata":{_deep_object(DEEP)}}}]}}',
        ),
        ("d1",),
        "refused",
    ),
    (
        f"filters nested {DEEP} deep",
        _raw_tool_call(
            "d2", "rag_basic", f'{{"query":"q","options":{{"filters":{{"f":{_deep_object(DEEP)}}}}}}}'
        ),
        ("d2",),
        "refused",
    ),
    (
        f"arrays nested {DEEP} deep",
        _raw_tool_call("d3", "rag_basic", '{"query":"q","options":' + "[" * DEEP + "]" * DEEP + "}"),
        ("d3",),
        "refused",
    ),
    ("a 3 MB query", _tool_call("h1", "rag_basic", {"query": "q" * 3_000_000}), ("h1",), "refused"),
    (
        "a 1 MB title",
        _tool_call(
            "h2",
            "rag_ingest",
            {"collection_id": "raw", "documents": [{"content": "x", "title": "t" * 10**6}]},
        ),
        ("h2",),
        "refused",
    ),
    ("unknown method", _request("u1", "no/such_method", {}), ("u1",), "refused"),
    (
        "second initialize",
        _request("i2", "initialize", {"protocolVersion": "2025-06-18"}),
        ("i2",),
        "answered",
    ),
    ("unknown notification", b'{"jsonrpc":"2.0","method":"notifications/made_up"}', (), None),
    (
        "cancel of an unknown id",
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"never-sent"}}',
        (),
        None,
    ),
    (
        "cancel with params null",
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":null}',
        (),
        None,
    ),
    (
        "batch array",
        b'[{"jsonrpc":"2.0","id":"b1","method":"ping"},{"jsonrpc":"2.0","id":"b2","method":"tools/list"}]',
        ("b1", "b2"),
        "answered",
    ),
]


def _judge(response: dict[str, Any] | None, expectation: str) -> str | None:
    """The failure class of a response to a frame, or None when it is the answer the frame deserves."""
    if response is None:
        return f"no answer within {CALL_LIMIT_S} s"
    if TRACEBACK.search(json.dumps(response)):
        return "traceback in an answer"
    result = response.get("result")
    refused = "error" in response or (isinstance(result, dict) and result.get("isError") is True)
    if expectation == "refused" and not refused:
        return "invalid input accepted"
    if expectation == "invalid_params":
        if "error" in response:
            return (
                None
                if response["error"].get("code") == -32602
                else (f"JSON-RPC error {response['error'].get('code')} instead of -32602")
            )
        text = "".join(c.get("text", "") for c in (result or {}).get("content", []))
        if not refused or '"INVALID_PARAMETERS"' not in text:
            return "not refused as -32602 or INVALID_PARAMETERS"
    return None


def _initialize(server: RawServer) -> None:
    """The MCP handshake by hand, then an ingest, so the worker and its model are up before the frames."""
    server.write(
        _request(
            "init",
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "fuzz", "version": "1"},
            },
        )
    )
    assert server.wait_for("init", 60) is not None, "the server answers initialize"
    server.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    server.write(_tool_call("warm", "rag_ingest", {"collection_id": "raw", "documents": DOCUMENTS}))
    warm = server.wait_for("warm", 180)
    assert warm is not None and not warm["result"].get("isError"), warm


def _raw_server(repo_root: Path, server_entry: Path, env: dict[str, str], folder: Path) -> RawServer:
    server = RawServer(
        server_entry, repo_root, {**env, "RAG_DATA_DIR": str(folder / "data")}, folder / "stderr"
    )
    _initialize(server)
    return server


def _alive_checks(server: RawServer, stderr_path: Path, findings: Findings) -> None:
    server.write(_request("final-ping", "ping"))
    if server.wait_for("final-ping", CALL_LIMIT_S) is None:
        findings.add("no answer to the final ping", "after every frame")
    if server.process.poll() is not None:
        findings.add("the server exited", f"exit status {server.process.returncode}")
    for line in server.non_protocol_lines():
        findings.add("non-protocol line on stdout", line[:200].decode(errors="replace"))
    starts = stderr_path.read_text(errors="replace").count(WORKER_STARTED)
    if starts != 1:
        findings.add("worker crashed or restarted", f"started {starts} times")


def test_raw_frames_are_answered_and_never_break_the_server(
    repo_root: Path, server_entry: Path, fuzz_env: dict[str, str], tmp_path: Path
) -> None:
    server = _raw_server(repo_root, server_entry, fuzz_env, tmp_path)
    findings = Findings()
    try:
        for position, (label, frame, ids, expectation) in enumerate(RAW_FRAMES):
            server.write(frame)
            for request_id in ids:
                assert expectation is not None
                failure = _judge(server.wait_for(request_id, CALL_LIMIT_S), expectation)
                if failure:
                    findings.add(failure, label)
            # Whatever the frame, the server goes on answering.
            ping = f"ping-{position}"
            server.write(_request(ping, "ping"))
            if server.wait_for(ping, CALL_LIMIT_S) is None:
                findings.add("no answer to a ping after the frame", label)
        _alive_checks(server, tmp_path / "stderr", findings)
    finally:
        server.stop()
    assert not findings.by_class, f"{len(RAW_FRAMES)} raw frames; failures:\n{findings.report()}"


# Hostile calls that wait for a free slot (issue 11 defects 1 and 2): one slot, a slow ingest holding it.
WAITING_FRAMES = [
    (
        f"metadata nested {DEEP} deep, waiting for a slot",
        _raw_tool_call(
            "w1",
            "rag_ingest",
            f'{{"collection_id":"raw","documents":[{{"content":"x","metadata":{_deep_object(DEEP)}}}]}}',
        ),
        "w1",
    ),
    (
        "lone surrogate, waiting for a slot",
        _tool_call("w2", "rag_basic", {"query": "insulin \ud800 x"}),
        "w2",
    ),
]
SLOW_INGEST = [
    {"id": f"slow-{i}", "content": f"Insulin signalling paper {i}. Glucose uptake rises in muscle. " * 8}
    for i in range(20)
]


def test_hostile_calls_waiting_for_a_slot_are_answered(
    repo_root: Path, server_entry: Path, fuzz_env: dict[str, str], tmp_path: Path
) -> None:
    server = _raw_server(repo_root, server_entry, {**fuzz_env, "MAX_CONCURRENT_REQUESTS": "1"}, tmp_path)
    findings = Findings()
    try:
        for position, (label, frame, request_id) in enumerate(WAITING_FRAMES):
            slow = f"slow-{position}"
            server.write(
                _tool_call(slow, "rag_ingest", {"collection_id": f"slow{position}", "documents": SLOW_INGEST})
            )
            server.write(frame)
            failure = _judge(server.wait_for(request_id, CALL_LIMIT_S), "answered")
            if failure:
                findings.add(failure, label)
            if server.wait_for(slow, 120) is None:
                findings.add("the slow ingest was never answered", label)
        _alive_checks(server, tmp_path / "stderr", findings)
    finally:
        server.stop()
    assert not findings.by_class, f"failures:\n{findings.report()}"

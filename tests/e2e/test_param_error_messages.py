"""Errors that name the actual problem (raw stdio frames, as the official client will not send them): a
progressToken that is no string or integer, a resource URI whose limit is not an integer, params that fail
any method's schema, an unknown tool and a cursor this server never issued (MCP 2025-06-18: -32602)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.raw_server import RawServer

pytestmark = pytest.mark.e2e

PROMPT_S = 30


@pytest.fixture(scope="module")
def server(repo_root: Path, server_entry: Path, server_env: dict[str, str]) -> Iterator[RawServer]:
    raw = RawServer(repo_root, server_entry, server_env)
    yield raw
    raw.close()


def test_an_object_progress_token_is_named(server: RawServer) -> None:
    params = {"name": "rag_list_collections", "arguments": {}, "_meta": {"progressToken": {"x": 1}}}
    answer = server.wait(server.request("tools/call", params), timeout=PROMPT_S)
    assert answer["error"]["code"] == -32602, answer
    assert "progressToken must be a string or an integer" in answer["error"]["message"]
    assert "needs jsonrpc" not in answer["error"]["message"]


@pytest.mark.parametrize("limit", ["abc", "2.5", ""])
def test_a_non_integer_limit_is_named_with_its_value(server: RawServer, limit: str) -> None:
    uri = f"rag://collection/any/documents?limit={limit}"
    answer = server.wait(server.request("resources/read", {"uri": uri}), timeout=PROMPT_S)
    assert answer["error"]["code"] == -32602, answer
    message = answer["error"]["message"]
    assert "limit" in message and f'"{limit}"' in message, message
    assert "None is not of type" not in message


@pytest.mark.parametrize(
    ("method", "params", "named"),
    [
        ("resources/read", {}, "params.uri"),
        ("resources/read", {"uri": 5}, "params.uri"),
        ("tools/list", {"cursor": 5}, "params.cursor"),
        ("resources/list", {"cursor": {}}, "params.cursor"),
        ("resources/templates/list", {"cursor": []}, "params.cursor"),
        ("initialize", {}, "params.protocolVersion"),
    ],
)
def test_params_that_fail_a_methods_schema_are_invalid_params_in_one_line(
    server: RawServer, method: str, params: dict[str, object], named: str
) -> None:
    answer = server.wait(server.request(method, params), timeout=PROMPT_S)
    assert answer["error"]["code"] == -32602, answer
    message = answer["error"]["message"]
    assert message.startswith(f"Invalid params: {method} {named}: "), message
    assert "\n" not in message and "invalid_type" not in message, "one readable line, not a zod dump"
    assert server.alive()


def test_an_unknown_tool_is_invalid_params(server: RawServer) -> None:
    answer = server.wait(server.call_tool("rag_no_such_tool", {}), timeout=PROMPT_S)
    assert answer["error"]["code"] == -32602, answer
    message = answer["error"]["message"]
    assert "Unknown tool: rag_no_such_tool" in message and "rag_basic" in message, message


@pytest.mark.parametrize("method", ["tools/list", "resources/list", "resources/templates/list"])
def test_a_cursor_on_an_unpaginated_list_is_invalid(server: RawServer, method: str) -> None:
    """Each list is one page, so no cursor was ever issued: any cursor is invalid, not ignored."""
    answer = server.wait(server.request(method, {"cursor": "not-a-cursor"}), timeout=PROMPT_S)
    assert answer["error"]["code"] == -32602, answer
    assert "invalid cursor" in answer["error"]["message"]
    assert "result" in server.wait(server.request(method, {}), timeout=PROMPT_S), "no cursor: the whole list"

"""Errors that name the actual problem (raw stdio frames, as the official client will not send them): a
progressToken that is no string or integer, and a resource URI whose limit is not an integer."""

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

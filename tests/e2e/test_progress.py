"""A long ingest reports progress, and is not cut off by REQUEST_TIMEOUT_MS while it makes progress."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.e2e.conftest import INITIALIZE_TIMEOUT_S
from tests.e2e.mcp_harness import result_json
from tests.e2e.paced import SLOW_DOCUMENTS, paced_endpoint, paced_settings
from tests.fake_openai import FakeOpenAIServer

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# Far shorter than the paced ingest takes on any machine, far longer than any step of it (tests/e2e/paced.py).
REQUEST_TIMEOUT_MS = 4_000


@pytest.fixture(scope="module")
def paced() -> Iterator[FakeOpenAIServer]:
    endpoint = paced_endpoint()
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="module")
async def short_timeout_session(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], paced: FakeOpenAIServer
) -> AsyncIterator[ClientSession]:
    env = {**server_env, "REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS), **paced_settings(paced)}
    params = StdioServerParameters(command="node", args=[str(server_entry)], env=env, cwd=repo_root)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
        with anyio.fail_after(INITIALIZE_TIMEOUT_S):
            await client.initialize()
        yield client


async def test_a_long_ingest_reports_progress_and_outlives_the_time_limit(
    short_timeout_session: ClientSession,
) -> None:
    steps: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, message or ""))

    started = anyio.current_time()
    with anyio.fail_after(600):
        result = await short_timeout_session.call_tool(
            "rag_ingest",
            {"collection_id": "long", "documents": SLOW_DOCUMENTS},
            progress_callback=on_progress,
        )
    took_ms = (anyio.current_time() - started) * 1000
    body = result_json(result)
    assert not result.isError, body
    assert body["ingested_count"] == len(SLOW_DOCUMENTS)
    assert took_ms > REQUEST_TIMEOUT_MS, f"the ingest took only {took_ms:.0f} ms: it proves nothing"
    progress = [value for value, _ in steps]
    assert len(progress) >= 5 and progress == sorted(progress) and len(set(progress)) == len(progress)
    messages = " | ".join(message for _, message in steps)
    assert "embedding" in messages and "/" in messages and "committing" in messages, messages


async def test_a_call_without_a_progress_token_gets_no_progress_but_still_completes(
    short_timeout_session: ClientSession,
) -> None:
    with anyio.fail_after(600):
        result = await short_timeout_session.call_tool(
            "rag_ingest", {"collection_id": "long2", "documents": SLOW_DOCUMENTS[:60]}
        )
    assert not result.isError, result_json(result)

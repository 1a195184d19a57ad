"""A long ingest reports progress, and is not cut off by REQUEST_TIMEOUT_MS while it makes progress."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.e2e.conftest import INITIALIZE_TIMEOUT_S
from tests.e2e.mcp_harness import result_json
from tests.fake_openai import FakeOpenAIServer

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# Far shorter than the ingest below takes on any machine, far longer than any step of it: the ingest's
# chunks (about 300) go to the hosted embedding API's test double 16 at a time, and it answers each
# request after PACE_S. (A local encode was the slow part before: a quiet machine finished it in under
# 4 s, and the test could not tell progress from speed.)
REQUEST_TIMEOUT_MS = 4_000
BATCH = 16
PACE_S = 0.4
DOCUMENTS = [
    {
        "id": f"long-{i}",
        "content": " ".join(
            f"Section {i}.{j}: glaciers in region {i} retreated {j} metres while sea ice thinned."
            for j in range(40)
        ),
    }
    for i in range(100)
]


@pytest.fixture(scope="module")
def paced_endpoint() -> Iterator[FakeOpenAIServer]:
    """The hosted embedding API's test double, answering each batch of an ingest after PACE_S."""
    endpoint = FakeOpenAIServer()
    endpoint.on_request = lambda body: (
        time.sleep(PACE_S) if isinstance(body.get("input"), list) and len(body["input"]) > 1 else None
    )
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="module")
async def short_timeout_session(
    repo_root: Path, server_entry: Path, server_env: dict[str, str], paced_endpoint: FakeOpenAIServer
) -> AsyncIterator[ClientSession]:
    env = {
        **server_env,
        "REQUEST_TIMEOUT_MS": str(REQUEST_TIMEOUT_MS),
        "RAG_TECHNIQUES": "basic",
        **paced_endpoint.embedding_env(),
        "EMBEDDING_BATCH_SIZE": str(BATCH),
    }
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
            "rag_ingest", {"collection_id": "long", "documents": DOCUMENTS}, progress_callback=on_progress
        )
    took_ms = (anyio.current_time() - started) * 1000
    body = result_json(result)
    assert not result.isError, body
    assert body["ingested_count"] == len(DOCUMENTS)
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
            "rag_ingest", {"collection_id": "long2", "documents": DOCUMENTS[:60]}
        )
    assert not result.isError, result_json(result)

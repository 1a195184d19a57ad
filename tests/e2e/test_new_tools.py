"""rag_smart_questions and rag_generate_podcast through the real MCP server and the official client; the
podcast's audio read back as the rag://podcast/{name} resource (a real WAV, its length within 25%)."""

from __future__ import annotations

import array
import base64
import io
import wave
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, McpError
from mcp.types import BlobResourceContents
from pydantic import AnyUrl

from iris_rag.podcast.speech import rms
from tests.e2e.test_mcp_server import call
from tests.test_questions import sample_documents

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

PODCAST_TIMEOUT_S = 300
INGEST_TIMEOUT_S = 600  # the first call loads the model; every technique builds its index


@pytest.fixture(scope="module")
async def sci(session: ClientSession) -> str:
    """A collection of 25 SciFact abstracts, ingested through rag_ingest (every technique indexes them)."""
    with anyio.fail_after(INGEST_TIMEOUT_S):
        result = await session.call_tool(
            "rag_ingest", {"collection_id": "sci", "documents": sample_documents(25)}
        )
    assert not result.isError, result.content
    return "sci"


async def test_both_tools_are_listed_with_the_podcast_template(session: ClientSession) -> None:
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert tools["rag_smart_questions"].annotations.readOnlyHint is True  # type: ignore[union-attr]
    assert tools["rag_generate_podcast"].annotations.readOnlyHint is False  # type: ignore[union-attr]
    templates = {t.uriTemplate: t for t in (await session.list_resource_templates()).resourceTemplates}
    assert templates["rag://podcast/{name}"].mimeType == "audio/wav"


async def test_smart_questions_cite_chunks_that_exist(session: ClientSession, sci: str) -> None:
    result, body = await call(
        session,
        "rag_smart_questions",
        {"context": "vitamin D and bone health", "collection_id": sci, "count": 3},
    )
    assert not result.isError, body
    assert body["method"] == "extractive" and 1 <= len(body["questions"]) <= 3
    for question in body["questions"]:
        assert question["question"].endswith("?") and question["retrieval_rank"] <= body["verify_top_k"]
        _, document = await call(
            session,
            "rag_get_document",
            {"collection_id": sci, "document_id": question["document_id"], "include_chunks": True},
        )
        assert question["chunk_ids"][0] in {c["chunk_id"] for c in document["chunks"]}
    refused, error = await call(session, "rag_smart_questions", {"context": "x", "count": 11})
    assert refused.isError and error["error"]["code"] == "INVALID_PARAMETERS"


async def test_a_one_minute_podcast_reads_back_as_real_audio(session: ClientSession, sci: str) -> None:
    with anyio.fail_after(PODCAST_TIMEOUT_S):
        result = await session.call_tool(
            "rag_generate_podcast", {"topic": "vitamin D", "collection_id": sci, "duration_minutes": 1}
        )
    assert not result.isError, result.content
    body = result.structuredContent
    assert body is not None and body["script_source"] == "extractive"
    read = await session.read_resource(AnyUrl(body["resource_uri"]))
    content = read.contents[0]
    assert isinstance(content, BlobResourceContents) and content.mimeType == "audio/wav"
    data = base64.b64decode(content.blob)
    assert data == Path(body["audio_path"]).read_bytes()
    with wave.open(io.BytesIO(data)) as audio:
        samples = array.array("h", audio.readframes(audio.getnframes()))
        seconds = audio.getnframes() / audio.getframerate()
    assert abs(seconds - 60) <= 15, seconds
    assert body["duration_s"] == pytest.approx(seconds, abs=0.01)
    assert rms(samples) > 500, "the audio is silence"
    assert {turn["speaker"] for turn in body["transcript"]} == {"host", "guest"}


@pytest.mark.parametrize(("uri", "code"), [("rag://podcast/nope", -32002), ("rag://podcast/..%2Fx", -32602)])
async def test_an_unknown_podcast_is_a_clear_error(session: ClientSession, uri: str, code: int) -> None:
    with anyio.fail_after(60), pytest.raises(McpError) as raised:
        await session.read_resource(AnyUrl(uri))
    assert raised.value.error.code == code, raised.value.error.message

"""The worker process's stderr (the MCP host's log): no credential in it, no traceback for a setting."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import ROOT
from tests.fake_openai import FakeOpenAIServer


@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(status=500)
    yield server
    server.close()


def _worker(data_dir: Path, requests: list[dict[str, Any]], **env: str) -> subprocess.CompletedProcess[str]:
    """The worker answering these requests, then seeing its input end (it drains and exits)."""
    lines = b"".join(orjson.dumps(request) + b"\n" for request in requests)
    return subprocess.run(
        [sys.executable, "-m", "iris_rag.bridge"],
        cwd=ROOT,
        env={**os.environ, "RAG_DATA_DIR": str(data_dir), **env},
        input=lines.decode(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_library_log_lines_mask_the_base_url_credentials(tmp_path: Path, fake_llm: FakeOpenAIServer) -> None:
    """At the default LOG_LEVEL=INFO httpx logs every request's URL, userinfo and query included."""
    base_url = fake_llm.base_url.replace("http://", "http://alice:URLPASS-s3cret@") + "?api-key=QTOKEN-98765"
    health = {"id": "h", "method": "health_check", "params": {"include_details": True}}
    done = _worker(
        tmp_path / "data",
        [health],
        LOG_LEVEL="INFO",
        LLM_PROVIDER="openai",
        LLM_BASE_URL=base_url,
        LLM_API_KEY="sk-worker-log-secret",
        RAG_TECHNIQUES="basic",
    )
    assert '"id":"h"' in done.stdout, done.stderr[-2000:]
    assert "HTTP Request: GET" in done.stderr, done.stderr[-2000:]
    leaked = [s for s in ("URLPASS-s3cret", "QTOKEN-98765", "sk-worker-log-secret") if s in done.stderr]
    assert not leaked, done.stderr[-2000:]
    assert fake_llm.requests[0]["path"] == "/v1/models?api-key=QTOKEN-98765"


def test_a_technique_the_embedding_api_cannot_serve_stops_the_worker_with_one_line(tmp_path: Path) -> None:
    done = _worker(
        tmp_path / "data",
        [],
        LOG_LEVEL="WARNING",
        EMBEDDING_PROVIDER="openai",
        EMBEDDING_MODEL="fake-embedder",
        EMBEDDING_BASE_URL="http://127.0.0.1:9/v1",
        RAG_TECHNIQUES="all",
    )
    assert done.returncode == 1
    assert done.stderr.startswith("fatal WORKER_UNAVAILABLE: rag_colbert needs the local embedding model")
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr

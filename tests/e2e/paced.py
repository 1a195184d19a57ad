"""A rag_ingest that takes seconds on any machine and reports progress all along.

Its chunks (about 300) go to the hosted embedding API's test double PACED_BATCH at a time, each request
answered after PACE_S: far longer than any step of the ingest, far shorter than the whole. (A local encode
was the slow part before: a quiet machine finished it in under 4 s, and a test could not tell progress
from speed.) Used by test_progress.py and the HTTP cancellation and shutdown tests.
"""

from __future__ import annotations

import time

from tests.fake_openai import FakeOpenAIServer

PACE_S = 0.4
PACED_BATCH = 16
SLOW_DOCUMENTS = [
    {
        "id": f"slow-{i}",
        "content": " ".join(
            f"Section {i}.{j}: glaciers in region {i} retreated {j} metres while sea ice thinned."
            for j in range(40)
        ),
    }
    for i in range(100)
]


def paced_endpoint() -> FakeOpenAIServer:
    """The embedding API's test double, answering each batch (not a single query) after PACE_S; close it."""
    endpoint = FakeOpenAIServer()
    endpoint.on_request = lambda body: (
        time.sleep(PACE_S) if isinstance(body.get("input"), list) and len(body["input"]) > 1 else None
    )
    return endpoint


def paced_settings(endpoint: FakeOpenAIServer) -> dict[str, str]:
    """The server's settings to embed through the paced endpoint, serving rag_basic only."""
    return {**endpoint.embedding_env(), "EMBEDDING_BATCH_SIZE": str(PACED_BATCH), "RAG_TECHNIQUES": "basic"}

"""FakeOpenAIServer: a test double for a hosted OpenAI-compatible LLM, which cannot run on these machines.

It speaks the real HTTP API on loopback, so the real `openai` client and our generator are exercised. It
also answers POST /v1/embeddings (the embedding API, EMBEDDING_PROVIDER=openai) with deterministic vectors:
fake_embedding() hashes each word into one of `dimensions` buckets, so texts that share words point alike.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

EMBEDDING_DIMENSIONS = 64  # the fake model's full vector size (a request's `dimensions` shortens it)


def fake_embedding(text: str, dimensions: int = EMBEDDING_DIMENSIONS) -> list[float]:
    """A bag of hashed words, unit length: deterministic, and similar for texts that share words."""
    vector = np.zeros(dimensions, dtype=np.float64)
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.sha256(word.encode()).digest()
        vector[int.from_bytes(digest[:4], "big") % dimensions] += 1.0
    vector[0] += 1e-3  # never the zero vector
    return [float(v) for v in vector / np.linalg.norm(vector)]


class FakeOpenAIServer:
    """Answers POST /v1/chat/completions, POST /v1/embeddings and GET /v1/models (or with a status code),
    recording requests."""

    def __init__(
        self, reply: str | None = "Aspirin lowers heart-attack risk [1].", status: int = 200
    ) -> None:
        self.reply = reply  # None: content null, as some servers send when the model wrote nothing
        self.status = status
        # "length": the model stopped at max_tokens (a reasoning model that spent them all thinking).
        self.finish_reason = "stop"
        # (content type, text): a 200 sent as is instead of a completion (a proxy's HTML login page, say).
        self.raw_reply: tuple[str, str] | None = None
        # The error object of a failure (status other than 200): OpenAI's shape, with its code if any.
        self.error: dict[str, Any] = {"message": "fake failure", "type": "server_error"}
        # GET /models' own status when it differs from the chat's (404: a server without the endpoint).
        self.models_status: int | None = None
        self.requests: list[dict[str, Any]] = []
        # Called with each chat request as it arrives (a test cancels its request here).
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(
                    {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
                )
                if fake.on_request is not None:
                    fake.on_request(body)
                if fake.status == 200 and fake.raw_reply is not None:
                    content_type, text = fake.raw_reply
                    self._send(200, content_type, text.encode())
                    return
                if fake.status != 200:
                    payload: dict[str, Any] = {"error": fake.error}
                elif self.path.partition("?")[0].endswith("/embeddings"):
                    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    size = int(body.get("dimensions") or EMBEDDING_DIMENSIONS)
                    payload = {
                        "object": "list",
                        "model": body["model"],
                        "data": [
                            {"object": "embedding", "index": i, "embedding": fake_embedding(t, size)}
                            for i, t in enumerate(texts)
                        ],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    }
                else:
                    payload = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": fake.reply},
                                "finish_reason": fake.finish_reason,
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                self._send(fake.status, "application/json", json.dumps(payload).encode())

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.requests.append(
                    {"path": self.path, "body": None, "auth": self.headers.get("Authorization")}
                )
                models = {
                    "object": "list",
                    "data": [{"id": "fake-model", "object": "model", "owned_by": "fake"}],
                }
                status = fake.status if fake.models_status is None else fake.models_status
                payload = models if status == 200 else {"error": {"message": "fake failure"}}
                self._send(status, "application/json", json.dumps(payload).encode())

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_port}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def llm_settings(self) -> dict[str, Any]:
        """The Settings fields (by env name) that point the server's one LLM client at this double."""
        return {
            "LLM_PROVIDER": "openai",
            "LLM_MODEL": "fake-model",
            "LLM_API_KEY": "sk-test",
            "LLM_BASE_URL": self.base_url,
            "LLM_MAX_RETRIES": 0,
        }

    def embedding_env(self) -> dict[str, str]:
        """The environment (for a server process) that points its embedding API client at this double."""
        return {
            "EMBEDDING_PROVIDER": "openai",
            "EMBEDDING_MODEL": "fake-embedder",
            "EMBEDDING_BASE_URL": self.base_url,
            "EMBEDDING_API_KEY": "sk-e2e-embedding-key",
            "EMBEDDING_MAX_RETRIES": "0",
        }

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()

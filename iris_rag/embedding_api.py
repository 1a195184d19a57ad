"""An OpenAI-compatible embedding endpoint in place of the local model (EMBEDDING_PROVIDER=openai).

POST {EMBEDDING_BASE_URL}/embeddings with EMBEDDING_MODEL (and `dimensions` when EMBEDDING_DIMENSIONS is
set), through the same `openai` package the LLM uses. Vectors come back unit-normalized, as the local
model's do. Collections record `openai:MODEL[@DIMENSIONS]` (Settings.embedding_model_id), so the mismatch
guard refuses to mix them with the local model's vectors or another model's.

There are no word pieces here: rag_colbert (token vectors) is refused at start, and rag_hyde counts its
hypothesis length in words and punctuation (APPROXIMATE_TOKENS) instead of the local model's word pieces.
An endpoint that cannot be reached, or fails, is EMBEDDING_SERVICE_UNAVAILABLE, with the key masked.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from iris_rag import progress
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import EmbeddingServiceUnavailableError
from iris_rag.onnx_model import QueryStates
from iris_rag.redaction import redact
from iris_rag.settings import Settings

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
Vectors = npt.NDArray[np.float32]

RECENT_QUERIES = 64  # query vectors remembered: retrieval and the relevance check embed the same query
QUERY_THREADS = 4  # queries embedded at once (each waits on the network, not the CPU)
APPROXIMATE_TOKENS = re.compile(r"\w+|[^\w\s]")
"""What a "token" is without the local model: a word or a punctuation mark."""


class ApproximateTokenizer:
    """Words and punctuation marks, for the few callers that count or cut text in tokens (rag_hyde)."""

    def tokenize(self, text: str) -> list[str]:
        """The text's words and punctuation marks."""
        return APPROXIMATE_TOKENS.findall(text)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Tokens joined back into text (spaces between words; none before punctuation)."""
        text = " ".join(tokens)
        return re.sub(r" (?=[^\w\s])", "", text)

    def __len__(self) -> int:
        return 0


class ApiEmbedder:
    """TextEncoder over an OpenAI-compatible /embeddings endpoint."""

    token_level = False  # no word pieces, no hidden states: rag_colbert cannot run on it

    def __init__(self, settings: Settings) -> None:
        from iris_rag.llm import openai_compatible_client

        self.model_name = settings.embedding_model_id
        self.api_model = settings.embedding_model
        self.batch_size = settings.embedding_batch_size
        self.requested_dimensions = settings.embedding_dimensions
        self.error: str | None = None
        self.load_time_s: float | None = None
        self.onnx_export: str | None = None  # a hosted model has nothing to export
        self.backend: str | None = "api"
        self.tokenizer = ApproximateTokenizer()
        self._secrets = settings.llm_secrets
        api_key = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else None
        self._client: Any = openai_compatible_client(
            base_url=settings.embedding_base_url,
            api_key=api_key,
            timeout_s=settings.embedding_timeout_s,
            max_retries=settings.embedding_max_retries,
        )
        self._dimension: int | None = None
        self._ok: bool | None = None  # the last request's outcome; None before the first
        self._lock = threading.Lock()
        self._queries = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="embed-query")
        self._recent: OrderedDict[str, Future[Vectors]] = OrderedDict()

    @property
    def state(self) -> Literal["loading", "ready", "failed"]:
        """Ready once the endpoint has answered; failed while its last request failed (each call retries)."""
        if self._ok is None:
            return "loading"
        return "ready" if self._ok else "failed"

    def start_loading(self) -> None:
        """Ask the endpoint once in the background: its dimension, and whether it answers at all."""
        threading.Thread(target=self._probe, name="embed-probe", daemon=True).start()

    def _probe(self) -> None:
        started = time.perf_counter()
        try:
            self._dimension = int(self._request(["dimension probe"]).shape[1])
        except EmbeddingServiceUnavailableError:
            logger.warning("embedding endpoint: %s", self.error)
        else:
            self.load_time_s = time.perf_counter() - started

    def wait_ready(self, timeout: float | None = None) -> None:
        """Ready when the dimension is known; asks the endpoint if it never answered yet."""
        del timeout  # one request, bounded by EMBEDDING_TIMEOUT_S and EMBEDDING_MAX_RETRIES
        _ = self.dimension

    @property
    def dimension(self) -> int:
        """Vector size: learnt from the endpoint's first answer (EMBEDDING_DIMENSIONS asks for one)."""
        if self._dimension is None:
            self._dimension = int(self._request(["dimension probe"]).shape[1])
        return self._dimension

    def _request(self, texts: list[str]) -> Vectors:
        """One /embeddings call: unit-length rows in input order, or EMBEDDING_SERVICE_UNAVAILABLE."""
        # Floats, not the client's default base64: what every OpenAI-compatible server speaks.
        arguments: dict[str, Any] = {"model": self.api_model, "input": texts, "encoding_format": "float"}
        if self.requested_dimensions:
            arguments["dimensions"] = self.requested_dimensions
        try:
            response = self._client.embeddings.create(**arguments)
            rows = sorted(response.data, key=lambda item: item.index)
            vectors = np.asarray([row.embedding for row in rows], dtype=np.float32)
            if vectors.ndim != 2 or len(vectors) != len(texts):
                msg = f"the endpoint returned {len(rows)} vectors for {len(texts)} texts"
                raise ValueError(msg)
            if self._dimension is not None and vectors.shape[1] != self._dimension:
                msg = f"the endpoint returned {vectors.shape[1]}-dimensional vectors, not {self._dimension}"
                raise ValueError(msg)
        except Exception as exc:
            base = self._client.base_url
            message = redact(
                f"the embedding API at {base} failed: {type(exc).__name__}: {exc}", self._secrets
            )
            self._ok, self.error = False, message
            raise EmbeddingServiceUnavailableError(message, {"model": self.model_name}) from exc
        self._ok, self.error = True, None
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        result: Vectors = np.ascontiguousarray(vectors / np.where(norms == 0, 1, norms), dtype=np.float32)
        return result

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool = False,
        bulk: bool | None = None,
    ) -> Vectors:
        """Embed texts in requests of EMBEDDING_BATCH_SIZE, checking for cancellation between them."""
        del progress, bulk  # one request at a time either way; the server does the work
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        size = batch_size or self.batch_size
        parts = []
        for start in range(0, len(texts), size):
            check_cancelled()
            parts.append(self._request(texts[start : start + size]))
            if len(texts) > size:
                _advance(f"{min(start + size, len(texts))}/{len(texts)}")
        return np.concatenate(parts)

    def encode_query(self, query: str) -> Vectors:
        """One query as a 1-D unit vector."""
        return self.encode_query_async(query).result()

    def encode_query_async(self, query: str) -> Future[Vectors]:
        """The query's vector on a pool thread; the last RECENT_QUERIES are remembered (read-only)."""
        with self._lock:
            known = self._recent.get(query)
            if known is not None and not (known.done() and known.exception() is not None):
                self._recent.move_to_end(query)
                return known
            future = self._queries.submit(self._encode_one, query)
            self._recent[query] = future
            while len(self._recent) > RECENT_QUERIES:
                self._recent.popitem(last=False)
        return future

    def _encode_one(self, query: str) -> Vectors:
        vector: Vectors = self._request([query])[0]
        vector.flags.writeable = False
        return vector

    def encode_query_states_async(self, query: str) -> Future[QueryStates] | None:
        """An embedding API gives no hidden states."""
        del query
        return None

    def map_bulk(
        self, task: Callable[[Any, list[Any]], _T], items: Sequence[Any], *, cost: Callable[[Any], int]
    ) -> list[_T]:
        """No model to run tasks with: only rag_colbert asks, and it is refused at start."""
        del task, items, cost
        msg = "the embedding API has no token-level model (rag_colbert needs EMBEDDING_PROVIDER=local)"
        raise EmbeddingServiceUnavailableError(msg)

    def run_with_model(self, task: Callable[[Any], _T], *, single: bool = False) -> Future[_T]:
        """Run a tokenizer task against the approximate tokenizer (rag_hyde's truncation)."""
        del single
        future: Future[_T] = Future()
        try:
            future.set_result(task(self))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def word_piece_counts(self, texts: list[str]) -> list[int]:
        """Words and punctuation marks per text (the approximate tokens)."""
        return [len(self.tokenizer.tokenize(text)) for text in texts]


def _advance(message: str) -> None:
    progress.advance(message)

"""What every technique and the ingestor use to embed text, and the choice of provider (EMBEDDING_PROVIDER).

Two implementations: the local sentence-transformers model (iris_rag.embedder.Embedder, the default) and
an OpenAI-compatible embedding endpoint (iris_rag.embedding_api.ApiEmbedder). Both return unit-length
float32 rows; only the local model has real word-piece tokens (`token_level`), which rag_colbert needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from iris_rag.onnx_model import QueryStates
from iris_rag.settings import Settings

_T = TypeVar("_T")
_I = TypeVar("_I")


class TextEncoder(Protocol):
    """The embedding interface the pipelines, indexes and ingestor call."""

    model_name: str
    batch_size: int
    error: str | None
    load_time_s: float | None
    # The local model's ONNX export on a first start ("exporting", "exported: <path>", "failed: ..."),
    # None when there is none to do (an API encoder, ONNX already there, or the export turned off).
    onnx_export: str | None

    @property
    def state(self) -> Literal["loading", "ready", "failed"]:
        """Whether embeddings can be made now."""

    @property
    def backend(self) -> str | None:
        """What computes the vectors: onnx or torch (the local model, once loaded), or api."""

    @property
    def dimension(self) -> int:
        """Vector size."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (token-level techniques)."""

    def start_loading(self) -> None:
        """Get ready in the background."""

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until ready; raise EMBEDDING_SERVICE_UNAVAILABLE if it cannot be."""

    def encode(
        self,
        texts: list[str],
        *,
        batch_size: int | None = None,
        progress: bool = False,
        bulk: bool | None = None,
    ) -> npt.NDArray[np.float32]:
        """Unit-length float32 rows, one per text."""

    def encode_query(self, query: str) -> npt.NDArray[np.float32]:
        """One query as a 1-D unit vector."""

    def encode_query_async(self, query: str) -> Future[npt.NDArray[np.float32]]:
        """One query's vector, computed while the caller does other work."""

    def encode_query_states_async(self, query: str) -> Future[QueryStates] | None:
        """One query's vector with its word pieces' hidden states, in one pass; None where not offered."""

    def map_bulk(
        self, task: Callable[[Any, list[_I]], _T], items: Sequence[_I], *, cost: Callable[[_I], int]
    ) -> list[_T]:
        """Run task(model, slice) over slices of items as bulk work."""

    def run_with_model(self, task: Callable[[Any], _T], *, single: bool = False) -> Future[_T]:
        """Run a task with the model (token-level use)."""

    def word_piece_counts(self, texts: list[str]) -> list[int]:
        """Tokens per text."""


def token_level(encoder: TextEncoder) -> bool:
    """Whether the encoder has the local model's word pieces and hidden states (rag_colbert needs them)."""
    return bool(getattr(encoder, "token_level", True))


def create_encoder(settings: Settings) -> TextEncoder:
    """The encoder EMBEDDING_PROVIDER names, already getting ready in the background."""
    encoder: TextEncoder
    if settings.embedding_provider == "openai":
        from iris_rag.embedding_api import ApiEmbedder

        encoder = ApiEmbedder(settings)
    else:
        from iris_rag.embedder import Embedder

        encoder = Embedder(
            settings.embedding_model,
            batch_size=settings.embedding_batch_size,
            device=settings.embedding_device,
            backend=settings.embedding_backend,
            onnx_dir=settings.embedding_onnx_dir,
            export_onnx=settings.embedding_onnx_export,
        )
    encoder.start_loading()
    return encoder

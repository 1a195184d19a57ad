"""The contract of a technique index, kept in step with documents inside the store's own transactions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from iris_rag.stores.base import DocumentInput


class TechniqueIndex(Protocol):
    """An index a technique keeps next to the documents, in the same store.

    Heavy work (encoding, extraction) happens in prepare(), outside any transaction; write() and delete()
    run inside the store's transaction for the documents, so the index never drifts from them: a replaced
    or deleted document takes its index rows with it, and a failed ingest leaves both untouched. The index
    reaches its rows through the storage contract its technique declares (DocumentStore.technique_storage),
    so it holds no connection and no SQL.
    """

    name: str

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> Any:
        """Compute what write() will store for these documents; no database access."""

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        """Store the prepared rows (inside the ingest transaction, after the documents' chunks)."""

    def delete(self, collection_id: str, document_id: str) -> None:
        """Remove a document's rows (inside the replace or delete transaction, before its chunks go)."""

    def stats(self) -> dict[str, Any]:
        """Sizes and counts for health details."""

    def indexed_documents(self, collection_id: str) -> int:
        """How many of the collection's documents this index holds (fewer than stored: it needs a reindex)."""


@runtime_checkable
class DocumentCoverage(Protocol):
    """An index that can say which documents it holds: one the background builder may build.

    With INDEX_BUILD=background (the default) such an index is left out of the ingest's transaction and
    built afterwards, document batch by document batch (iris_rag/ingestion/background.py); the documents
    it lacks, found here, are what a restarted worker builds, so no queue needs to be kept.
    """

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents this index holds."""


class IndexProgress(Protocol):
    """What a pipeline asks the background builder (iris_rag/ingestion/background.py)."""

    def pending(self, collection_id: str) -> bool:
        """Whether index work for the collection is queued or running."""


@runtime_checkable
class CollectionState(Protocol):
    """An index that also keeps rows for a collection as a whole, beyond its documents' rows."""

    def drop_collection(self, collection_id: str) -> None:
        """Remove every row of the collection (in delete_collection's transaction, after its documents)."""


@dataclass(frozen=True, slots=True)
class ChunkEncoding:
    """What one forward pass over a chunk's text gave: the dense embedding when it is exact, and tokens.

    `pooled`: one row per span a SpanPooling index asked for (its pooling_spans, in order), the unit mean of
    the hidden states over the span; a NaN row where the pass could not give it (the chunk was cut first).
    """

    dense: npt.NDArray[np.float32] | None
    tokens: Any
    pooled: npt.NDArray[np.float32] | None = None


@runtime_checkable
class ChunkEncodingSource(Protocol):
    """An index whose own encoding of the chunk texts also yields their dense embeddings.

    The ingestor then runs the model once per chunk instead of twice: it takes the dense vectors from
    this pass (encoding apart only the chunks where `dense` is None) and hands the tokens to prepare()
    through ChunkInput.tokens.
    """

    def encode_chunks(
        self, texts: list[str], spans: list[list[tuple[int, int]]] | None = None
    ) -> list[ChunkEncoding]:
        """One encoding per text, in order; with `spans` (per text), each encoding's pooled rows too."""


@runtime_checkable
class SpanPooling(Protocol):
    """An index whose vectors come from the chunks' own forward pass, mean-pooled over spans of their text.

    With NODERAG_LEAF_VECTORS=pooled (off by default), the ingestor asks it for the spans before the
    ChunkEncodingSource's pass, and hands each chunk's ChunkEncoding (with `pooled`) to prepare() through
    ChunkInput.tokens. Otherwise, or without such a pass (no source served), nothing is pooled and the
    index embeds its texts itself.
    """

    def pooling_spans(
        self, title: str, content: str, chunks: list[tuple[int, int]]
    ) -> list[list[tuple[int, int]]]:
        """Per chunk (its [start, end) in the content), spans of its embedding text to pool, in order."""

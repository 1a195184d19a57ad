"""What rag_colbert stores, as a contract each store backend implements (backends/<backend>/colbert.py).

One row per chunk: its kept word-piece ids and int8 token codes (as bytes, in the technique's own
encoding) with one scale; and per collection, in how many chunks each word piece occurs (the document
frequencies behind the query-side IDF).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class TokenRow:
    """A chunk's compressed token vectors, as stored."""

    chunk_id: str
    document_id: str
    token_count: int
    dimension: int
    scale: float
    token_ids: bytes
    codes: bytes


@dataclass(frozen=True, slots=True)
class TokenTotals:
    """Sizes of the token store over every collection, for health details."""

    chunks: int
    documents: int
    tokens: int
    bytes: int


class TokenVectorStorage(Protocol):
    """Token rows and word-piece frequencies; writes join the store's open ingest transaction."""

    def insert(self, collection_id: str, rows: list[TokenRow]) -> None:
        """Add the chunks' rows."""

    def document_token_ids(self, collection_id: str, document_id: str) -> list[bytes]:
        """The word-piece ids of each of a document's rows (what deleting it takes out of the frequencies)."""

    def delete_document(self, collection_id: str, document_id: str) -> None:
        """Remove a document's rows."""

    def add_frequencies(self, collection_id: str, deltas: dict[int, int]) -> None:
        """Add each delta to its word piece's chunk count; counts that reach zero go."""

    def load(self, collection_id: str, chunk_ids: list[str]) -> list[TokenRow]:
        """The rows of the given chunks (chunks without one are left out)."""

    def frequencies(self, collection_id: str) -> tuple[int, dict[int, int]]:
        """How many chunks have rows, and in how many of them each word piece occurs."""

    def indexed_chunks(self, collection_id: str) -> int:
        """How many chunks have rows (one cheap count)."""

    def indexed_documents(self, collection_id: str) -> int:
        """Distinct documents with rows in the collection."""

    def indexed_document_ids(self, collection_id: str) -> set[str]:
        """The ids of the collection's documents with rows."""

    def totals(self) -> TokenTotals:
        """Rows, documents, tokens and bytes over every collection."""

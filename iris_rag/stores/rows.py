"""Store rows as the contract's records: the one mapping both backends use (their rows read by column name).

A row is anything indexable by column name (sqlite3.Row, psycopg's dict rows). JSON metadata comes back as
text from SQLite and already decoded from Postgres' JSONB; `metadata()` takes either.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from iris_rag.stores.base import (
    CallRecord,
    CollectionInfo,
    DocumentInput,
    DocumentSummary,
    StoredChunk,
    StoredDocument,
)


class Row(Protocol):
    """A result row read by column name."""

    def __getitem__(self, key: str, /) -> Any:
        """The value of one column."""


def metadata(value: Any) -> dict[str, Any]:
    """A metadata column as a dict: JSON text (SQLite) or already decoded (Postgres JSONB)."""
    decoded: dict[str, Any] = orjson.loads(value) if isinstance(value, str | bytes) else value
    return decoded


def collection_info(row: Row) -> CollectionInfo:
    """A collection row with its counts and data version."""
    return CollectionInfo(
        id=row["id"],
        embedding_model=row["embedding_model"],
        dimension=int(row["dimension"]),
        document_count=int(row["document_count"]),
        chunk_count=int(row["chunk_count"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        description=row["description"],
        version=int(row["version"]),
    )


def stored_chunk(row: Row) -> StoredChunk:
    """A chunk row joined with its document's title and metadata."""
    return StoredChunk(
        chunk_id=row["chunk_id"],
        document_id=row["document_id"],
        index=int(row["chunk_index"]),
        content=row["content"],
        start_char=int(row["start_char"]),
        end_char=int(row["end_char"]),
        title=row["title"],
        metadata=metadata(row["metadata"]),
    )


def stored_document(row: Row) -> StoredDocument:
    """A document row."""
    return StoredDocument(
        id=row["id"],
        collection_id=row["collection_id"],
        title=row["title"],
        content=row["content"],
        metadata=metadata(row["metadata"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def written_dates(previous: StoredDocument | None, document: DocumentInput, now: str) -> tuple[str, str]:
    """created_at and updated_at of a document written now, replacing `previous` (None: a new one).

    Every backend's rule: updated_at moves only when the title, content or metadata change, so a reindex
    (or an ingest of the same text again) does not read as an edit.
    """
    if previous is None:
        return now, now
    unchanged = (previous.title, previous.content, previous.metadata) == (
        document.title,
        document.content,
        document.metadata,
    )
    return previous.created_at, previous.updated_at if unchanged else now


def document_summary(row: Row) -> DocumentSummary:
    """A document as a listing shows it (columns id, title, chars, chunks, created_at, updated_at)."""
    return DocumentSummary(
        row["id"], row["title"], int(row["chars"]), int(row["chunks"]), row["created_at"], row["updated_at"]
    )


def call_record(row: Row) -> CallRecord:
    """A call-log row."""
    return CallRecord(
        float(row["ts"]),
        row["tool"],
        row["technique"],
        float(row["duration_ms"]),
        bool(row["success"]),
        row["error_code"],
        row["principal"],
        row["request_id"],
        row["session_id"],
    )

"""get_collection's counts on SQLite: kept by the database's triggers (any process's write), never counted."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np

from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.stores.base import ChunkInput, CollectionInfo, DocumentInput


def document(doc_id: str, chunks: int) -> DocumentInput:
    vector = np.full(4, 0.5, dtype=np.float32)
    inputs = [ChunkInput(i, f"{doc_id} {i}", 0, 1, vector) for i in range(chunks)]
    return DocumentInput(doc_id, "", doc_id, {}, inputs)


def statements_of(store: SqliteStore, call: Callable[[], object]) -> list[str]:
    """The SQL the calling thread's connection runs during `call`."""
    ran: list[str] = []
    connection = store._connection()
    connection.set_trace_callback(ran.append)
    try:
        call()
    finally:
        connection.set_trace_callback(None)
    return ran


def test_counts_follow_every_write_of_another_store_without_counting_rows(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    reader, writer = SqliteStore(path), SqliteStore(path)
    writer.create_collection("c", "m", 4)
    writer.create_collection("other", "m", 4)
    writer.upsert_documents("other", [document("x", 4)])
    try:
        steps: list[tuple[Callable[[], object], int, int]] = [
            (lambda: None, 0, 0),
            (lambda: writer.upsert_documents("c", [document("a", 3), document("b", 2)]), 2, 5),
            (lambda: writer.upsert_documents("c", [document("a", 1)]), 2, 3),
            (lambda: writer.delete_document("c", "b"), 1, 1),
            (lambda: writer.delete_document("c", "absent"), 1, 1),
            (lambda: writer.set_description("c", "described"), 1, 1),
        ]
        seen: list[object] = []
        for write, documents, chunks in steps:
            write()
            ran = statements_of(reader, lambda: seen.append(reader.get_collection("c")))
            info = seen[-1]
            assert isinstance(info, CollectionInfo)
            assert (info.document_count, info.chunk_count) == (documents, chunks)
            assert not [s for s in ran if "COUNT(" in s.upper()], ran  # the first read after a write too
        listed = {info.id: (info.document_count, info.chunk_count) for info in reader.list_collections()}
        assert listed == {"c": (1, 1), "other": (1, 4)}
        final = reader.get_collection("c")
        assert final is not None and final.description == "described"
        writer.delete_collection("c")
        assert reader.get_collection("c") is None
        writer.create_collection("c", "m", 4)
        again = reader.get_collection("c")
        assert again is not None and (again.document_count, again.chunk_count) == (0, 0)
        other = reader.get_collection("other")
        assert other is not None and (other.document_count, other.chunk_count) == (1, 4)
    finally:
        reader.close()
        writer.close()


def test_a_database_from_before_the_counts_gets_them_on_opening(tmp_path: Path) -> None:
    """Schema 8 had no collection_counts: opening fills each collection's row from its rows."""
    path = tmp_path / "db.sqlite3"
    store = SqliteStore(path)
    store.create_collection("c", "m", 4)
    store.create_collection("empty", "m", 4)
    store.upsert_documents("c", [document("a", 3), document("b", 2)])
    store.close()
    connection = sqlite3.connect(path)
    connection.executescript(
        "DROP TRIGGER documents_count_insert; DROP TRIGGER documents_count_delete;"
        "DROP TRIGGER chunks_count_insert; DROP TRIGGER chunks_count_delete;"
        "DROP TABLE collection_counts; PRAGMA user_version = 8;"
    )
    connection.close()
    reopened = SqliteStore(path)
    try:
        info = reopened.get_collection("c")
        assert info is not None and (info.document_count, info.chunk_count) == (2, 5)
        empty = reopened.get_collection("empty")
        assert empty is not None and (empty.document_count, empty.chunk_count) == (0, 0)
        reopened.upsert_documents("c", [document("a", 1)])
        info = reopened.get_collection("c")
        assert info is not None and (info.document_count, info.chunk_count) == (2, 3)
    finally:
        reopened.close()

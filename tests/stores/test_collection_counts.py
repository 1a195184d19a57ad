"""get_collection's counts on SQLite: kept per data version, recounted only after a write (by any process)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from iris_rag.backends.sqlite import store as sqlite_store
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.stores.base import ChunkInput, DocumentInput


def document(doc_id: str, chunks: int) -> DocumentInput:
    vector = np.full(4, 0.5, dtype=np.float32)
    inputs = [ChunkInput(i, f"{doc_id} {i}", 0, 1, vector) for i in range(chunks)]
    return DocumentInput(doc_id, "", doc_id, {}, inputs)


def test_counts_follow_every_write_and_are_not_recounted_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db.sqlite3"
    reader, writer = SqliteStore(path), SqliteStore(path)
    writer.create_collection("c", "m", 4)
    counted: list[str] = []
    real = sqlite_store._counts

    def counting(connection: object, collection_id: str) -> tuple[int, int]:
        counted.append(collection_id)
        return real(connection, collection_id)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_store, "_counts", counting)
    try:
        steps: list[tuple[Callable[[], object], int, int]] = [
            (lambda: None, 0, 0),
            (lambda: writer.upsert_documents("c", [document("a", 3), document("b", 2)]), 2, 5),
            (lambda: writer.upsert_documents("c", [document("a", 1)]), 2, 3),
            (lambda: writer.delete_document("c", "b"), 1, 1),
            (lambda: writer.set_description("c", "described"), 1, 1),
        ]
        for write, documents, chunks in steps:
            write()
            for _ in range(3):
                info = reader.get_collection("c")
                assert info is not None
                assert (info.document_count, info.chunk_count) == (documents, chunks)
        final = reader.get_collection("c")
        assert final is not None and final.description == "described"
        # Once per data version the reader saw (4; a description moves none), and once for the writer's
        # own first get_collection (set_description returns one): not once per call.
        assert counted == ["c"] * 5
        writer.delete_collection("c")
        assert reader.get_collection("c") is None
        writer.create_collection("c", "m", 4)
        again = reader.get_collection("c")
        assert again is not None and (again.document_count, again.chunk_count) == (0, 0)
    finally:
        reader.close()
        writer.close()

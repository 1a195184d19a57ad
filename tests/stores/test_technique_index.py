"""The technique-index contract: its rows follow documents through ingest, replace, delete and failure."""

from pathlib import Path
from typing import Any

import pytest

from iris_rag.backends.sqlite.store import SqliteStore, sqlite_connection
from iris_rag.embedder import Embedder
from iris_rag.ingestion.ingestor import Ingestor
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.settings import Settings
from iris_rag.stores.base import DocumentInput


class WordCountIndex:
    """A minimal real index: one row per document with its word count."""

    name = "word_count"

    def __init__(self, store: SqliteStore, fail_on: str | None = None) -> None:
        self.store = store
        self.fail_on = fail_on

    def create_tables(self) -> None:
        connection = sqlite_connection(self.store)
        connection.execute(
            "CREATE TABLE IF NOT EXISTS word_counts (collection_id TEXT, document_id TEXT, n INT)"
        )

    def prepare(self, collection_id: str, documents: list[DocumentInput]) -> dict[str, int]:
        return {d.id: len(d.content.split()) for d in documents}

    def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
        connection = sqlite_connection(self.store)
        for document_id, count in prepared.items():
            if document_id == self.fail_on:
                raise RuntimeError("index failure")
            connection.execute(
                "INSERT INTO word_counts VALUES (?, ?, ?)", (collection_id, document_id, count)
            )

    def delete(self, collection_id: str, document_id: str) -> None:
        connection = sqlite_connection(self.store)
        connection.execute(
            "DELETE FROM word_counts WHERE collection_id = ? AND document_id = ?",
            (collection_id, document_id),
        )

    def stats(self) -> dict[str, Any]:
        connection = sqlite_connection(self.store)
        return {"rows": connection.execute("SELECT COUNT(*) FROM word_counts").fetchone()[0]}

    def indexed_documents(self, collection_id: str) -> int:
        connection = sqlite_connection(self.store)
        row = connection.execute("SELECT COUNT(*) FROM word_counts WHERE collection_id = ?", (collection_id,))
        return int(row.fetchone()[0])


def _rows(store: SqliteStore) -> list[tuple[str, int]]:
    return [
        tuple(r)
        for r in sqlite_connection(store).execute("SELECT document_id, n FROM word_counts ORDER BY 1")
    ]


def test_index_follows_documents(tmp_path: Path, embedder: Embedder) -> None:
    settings = Settings(RAG_DATA_DIR=tmp_path)
    store = SqliteStore(settings.database_path)
    index = WordCountIndex(store)
    store.register_index(index)
    ingestor = Ingestor(settings, store, embedder, [index])
    ingestor.ingest("c", [SourceDocument("a", "one two three"), SourceDocument("b", "four five")])
    assert _rows(store) == [("a", 3), ("b", 2)]
    ingestor.ingest("c", [SourceDocument("a", "just one")])
    assert _rows(store) == [("a", 2), ("b", 2)]
    store.delete_document("c", "b")
    assert _rows(store) == [("a", 2)]
    assert store.stats()["technique_indexes"] == {"word_count": {"rows": 1}}

    index.fail_on = "z"
    with pytest.raises(RuntimeError):
        ingestor.ingest("c", [SourceDocument("a", "replaced again"), SourceDocument("z", "boom")])
    assert _rows(store) == [("a", 2)], "the failed ingest changed neither the index nor the documents"
    assert store.get_document("c", "a").content == "just one"  # type: ignore[union-attr]


def test_indexed_documents_counts_per_collection(tmp_path: Path, embedder: Embedder) -> None:
    settings = Settings(RAG_DATA_DIR=tmp_path)
    store = SqliteStore(settings.database_path)
    index = WordCountIndex(store)
    store.register_index(index)
    Ingestor(settings, store, embedder, [index]).ingest("c", [SourceDocument("a", "x y")])
    Ingestor(settings, store, embedder, []).ingest("c", [SourceDocument("b", "no index here")])
    assert index.indexed_documents("c") == 1
    assert index.indexed_documents("other") == 0

"""The PostgreSQL bulk write path (COPY, the HNSW index built after the rows) against the row-by-row one."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from iris_rag import migration
from iris_rag.backends.postgres import store as store_module
from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.stores.base import ChunkInput, DocumentInput, KeywordQuery, NewCollection
from iris_rag.stores.filters import parse_filters
from tests.backends.postgres.blocks import posting_rows
from tests.conftest import SAMPLE_CORPUS

DIMENSION = 16
NEW = NewCollection("test-model", DIMENSION)


def _documents(limit: int, seed: int = 7, suffix: str = "") -> list[DocumentInput]:
    """SciFact sample abstracts in two chunks each, random unit vectors, an untitled one now and then."""
    rng = np.random.default_rng(seed)
    rows = [json.loads(line) for line in Path(SAMPLE_CORPUS).read_text().splitlines()[:limit]]
    documents = []
    for i, row in enumerate(rows):
        text = row["text"] + suffix
        half = len(text) // 2
        chunks = []
        for j, (start, end) in enumerate([(0, half), (half, len(text))]):
            vector = rng.standard_normal(DIMENSION).astype(np.float32)
            chunks.append(ChunkInput(j, text[start:end], start, end, vector / np.linalg.norm(vector)))
        title = "" if i % 7 == 0 else row["title"]
        documents.append(DocumentInput(row["_id"], title, text, {"i": i, "even": i % 2 == 0}, chunks))
    return documents


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(postgres_url)
    yield opened
    opened.close()


def _rows(store: PostgresStore, collection_id: str) -> dict[str, Any]:
    """Everything the collection holds, without row ids (their order kept) or times."""
    connection = store.connection()
    documents = connection.execute(
        "SELECT id, title, content, metadata FROM documents WHERE collection_id = %s ORDER BY row_id",
        (collection_id,),
    ).fetchall()
    chunks = connection.execute(
        "SELECT document_id, chunk_id, chunk_index, content, start_char, end_char, embedding::text, "
        "title_length, content_length, titled FROM chunks WHERE collection_id = %s ORDER BY row_id",
        (collection_id,),
    ).fetchall()
    chunk_ids = {
        row["row_id"]: row["chunk_id"]
        for row in connection.execute(
            "SELECT row_id, chunk_id FROM chunks WHERE collection_id = %s", (collection_id,)
        ).fetchall()
    }
    postings = sorted(
        (chunk_ids[chunk_row], term, *rest)
        for term, chunk_row, *rest in posting_rows(connection, collection_id)
    )
    totals = connection.execute(
        "SELECT chunks, titled_chunks, title_tokens, content_tokens FROM keyword_totals "
        "WHERE collection_id = %s",
        (collection_id,),
    ).fetchone()
    terms = connection.execute(
        "SELECT term, chunks, title_chunks, content_chunks FROM keyword_terms WHERE collection_id = %s "
        "ORDER BY term",
        (collection_id,),
    ).fetchall()
    return {"documents": documents, "chunks": chunks, "postings": postings, "totals": totals, "terms": terms}


def _has_index(store: PostgresStore, collection_id: str) -> bool:
    name = store_module._hnsw_index_name(collection_id)
    row = store.connection().execute("SELECT to_regclass(%s) IS NOT NULL AS found", (name,)).fetchone()
    assert row is not None
    return bool(row["found"])


def _copies(monkeypatch: pytest.MonkeyPatch, store: PostgresStore, collection_id: str) -> list[bool]:
    """Spy on the COPY path: for each call, whether the collection's HNSW index existed then."""
    seen: list[bool] = []
    copy = store._copy_documents

    def spy(*args: Any, **kwargs: Any) -> int:
        seen.append(_has_index(store, collection_id))
        return copy(*args, **kwargs)

    monkeypatch.setattr(store, "_copy_documents", spy)
    return seen


def _search_results(store: PostgresStore, collection_id: str, queries: npt.NDArray[np.float32]) -> list[Any]:
    found: list[Any] = [[h.chunk_id for h in store.vector_search(collection_id, q, 10)] for q in queries]
    for scoring in ("flat", "multifield"):
        for terms in (["cancer", "cells", "risk"], ["growth", "reference", "of", "the"], ["children"]):
            query = KeywordQuery.of(terms, 1.5, scoring)
            found.append(
                [(h.chunk_id, round(h.score, 9)) for h in store.keyword_search(collection_id, query, 20)]
            )
            filtered = store.keyword_search(collection_id, query, 20, parse_filters({"even": True}))
            found.append([(h.chunk_id, round(h.score, 9)) for h in filtered])
    return found


def test_a_bulk_load_equals_the_row_by_row_load(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = _documents(240)
    assert sum(len(d.chunks) for d in documents[:40]) < store_module.BULK_MIN_CHUNKS
    seen = _copies(monkeypatch, store, "bulk")
    for start in range(0, len(documents), 40):  # below BULK_MIN_CHUNKS: the row path
        store.upsert_documents("rows", documents[start : start + 40], new_collection=NEW)
    assert seen == []
    with store.bulk_load():
        for start in range(0, len(documents), 100):
            store.upsert_documents("bulk", documents[start : start + 100], new_collection=NEW)
        assert not _has_index(store, "bulk")  # built at the end, after the rows
    assert seen == [False, False, False]
    assert _has_index(store, "bulk")
    vacuumed = (
        store.connection()
        .execute(
            "SELECT last_vacuum IS NOT NULL AS done FROM pg_stat_user_tables WHERE relname = 'keyword_blocks'"
        )
        .fetchone()
    )
    assert vacuumed == {"done": True}
    assert _rows(store, "bulk") == _rows(store, "rows")
    assert len(_rows(store, "bulk")["postings"]) > 10_000

    # Replacing documents: a batch at BULK_MIN_CHUNKS copies too, keeps created_at, drops the old rows.
    created = store.get_document("bulk", documents[3].id)
    assert created is not None
    changed = _documents(260, seed=8, suffix=" Children grow.")[:250]
    assert sum(len(d.chunks) for d in changed) >= store_module.BULK_MIN_CHUNKS
    version = store.data_version("bulk")
    store.upsert_documents("bulk", changed)
    assert len(seen) == 4
    store.upsert_documents("rows", changed[:50])
    for start in range(50, 250, 40):
        store.upsert_documents("rows", changed[start : start + 40])
    assert store.data_version("bulk") > version
    assert _rows(store, "bulk") == _rows(store, "rows")
    replaced = store.get_document("bulk", documents[3].id)
    assert replaced is not None and replaced.created_at == created.created_at
    assert replaced.content.endswith("Children grow.")

    # The same answers: the vector leg through each collection's HNSW index, both keyword scorings.
    monkeypatch.setattr(store_module, "EXACT_SEARCH_MAX_CHUNKS", 10)
    rng = np.random.default_rng(1)
    queries = rng.standard_normal((10, DIMENSION)).astype(np.float32)
    expected = _search_results(store, "rows", queries)
    assert _search_results(store, "bulk", queries) == expected
    assert all(expected[:10]) and all(len(hits) > 3 for hits in expected[10:])
    store.delete_collection("bulk")
    assert not _has_index(store, "bulk")


def test_an_interrupted_bulk_load_leaves_no_half_collection(store: PostgresStore, postgres_url: str) -> None:
    documents = _documents(120)
    other = PostgresStore(postgres_url)
    try:
        with pytest.raises(KeyboardInterrupt), store.bulk_load():
            store.upsert_documents("c", documents[:60], new_collection=NEW)
            store.upsert_documents("c", documents[60:], new_collection=NEW)
            # Not visible to another connection before the commit.
            assert other.get_collection("c") is None
            raise KeyboardInterrupt
        # A vector of another dimension fails the index build at the end: all of it is rolled back.
        wrong = _documents(3, seed=2)
        wrong[2].chunks[0] = ChunkInput(0, "x", 0, 1, np.ones(DIMENSION + 1, dtype=np.float32))
        with pytest.raises(Exception, match="dimensions"), store.bulk_load():
            store.upsert_documents("c", documents, new_collection=NEW)
            store.upsert_documents("c", wrong, new_collection=NEW)
        for reader in (store, other):
            assert reader.get_collection("c") is None
            assert reader.document_ids("c") == []
            connection = reader.connection()
            for table in ("chunks", "keyword_blocks", "keyword_totals"):
                row = connection.execute(
                    f"SELECT COUNT(*) AS n FROM {table} WHERE collection_id = 'c'"
                ).fetchone()
                assert row == {"n": 0}
            assert not _has_index(reader, "c")
        # The same load completes afterwards.
        with store.bulk_load():
            store.upsert_documents("c", documents, new_collection=NEW)
        assert other.chunk_count("c") == 2 * len(documents) and _has_index(other, "c")
    finally:
        other.close()


@pytest.fixture
def source(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "source.sqlite3")
    opened.upsert_documents("docs", _documents(120), new_collection=NEW)
    opened.upsert_documents("other", _documents(10, seed=3), new_collection=NEW)
    yield opened
    opened.close()


def test_migrate_copies_through_the_bulk_path(
    source: SqliteStore, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _copies(monkeypatch, store, "docs")
    monkeypatch.setattr(migration, "BATCH", 50)
    migration.migrate(source, store, ["docs"])
    assert seen == [False, False, False]  # every batch by COPY (even below BULK_MIN_CHUNKS), no index yet
    assert _has_index(store, "docs")
    assert store.chunk_count("docs") == 240
    query = KeywordQuery.of(["cancer", "cells", "risk"])
    assert [h.chunk_id for h in store.keyword_search("docs", query, 10)] == [
        h.chunk_id for h in source.keyword_search("docs", query, 10)
    ]
    vector = np.random.default_rng(5).standard_normal(DIMENSION).astype(np.float32)
    assert [h.chunk_id for h in store.vector_search("docs", vector, 10)] == [
        h.chunk_id for h in source.vector_search("docs", vector, 10)
    ]


def test_an_interrupted_migrate_leaves_no_half_collection_in_postgres(
    source: SqliteStore, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = itertools.count()
    upsert = store.upsert_documents

    def failing(*args: Any, **kwargs: Any) -> int:
        if next(calls) == 3:
            raise RuntimeError("disk full")
        return upsert(*args, **kwargs)

    monkeypatch.setattr(migration, "BATCH", 50)
    monkeypatch.setattr(store, "upsert_documents", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        migration.migrate(source, store, ["other", "docs"])
    # 'other' (one batch) went whole with its index; 'docs' failed on its third batch and left nothing.
    assert [c.id for c in store.list_collections()] == ["other"]
    assert _has_index(store, "other") and not _has_index(store, "docs")
    assert store.document_ids("docs") == []
    row = (
        store.connection().execute("SELECT COUNT(*) AS n FROM chunks WHERE collection_id = 'docs'").fetchone()
    )
    assert row == {"n": 0}


def test_document_counts_follow_every_write_of_any_store(store: PostgresStore, postgres_url: str) -> None:
    """get_collection's document count (kept in keyword_totals by each write): never stale or rolled back."""
    documents = _documents(12)
    store.upsert_documents("c", documents[:5], new_collection=NEW)
    other = PostgresStore(postgres_url)
    try:
        assert store.get_collection("c") == other.get_collection("c")
        info = store.get_collection("c")
        assert info is not None and info.document_count == 5
        other.upsert_documents("c", documents[5:7])
        assert store.get_collection("c").document_count == 7  # type: ignore[union-attr]
        other.delete_document("c", documents[0].id)
        assert store.get_collection("c").document_count == 6  # type: ignore[union-attr]
        # Inside a transaction that rolls back: its own rows counted, nothing remembered of them. Two new
        # documents move the version on by two; so does another store's replacement of one document
        # after the rollback: the same version number, another count.
        version = store.data_version("c")
        with pytest.raises(RuntimeError), store.transaction():
            store.upsert_documents("c", documents[7:9])
            assert store.get_collection("c").document_count == 8  # type: ignore[union-attr]
            assert store.data_version("c") == version + 2
            raise RuntimeError
        other.upsert_documents("c", _documents(2, seed=4)[1:])
        assert store.data_version("c") == version + 2
        assert store.get_collection("c").document_count == 6  # type: ignore[union-attr]
        other.upsert_documents("c", documents[10:11])
        assert store.get_collection("c").document_count == 7  # type: ignore[union-attr]
        assert store.get_collection("c") == other.get_collection("c")
        store.delete_collection("c")
        assert store.get_collection("c") is None
        store.upsert_documents("c", documents[:2], new_collection=NEW)
        assert store.get_collection("c").document_count == 2  # type: ignore[union-attr]
    finally:
        other.close()
    # A database from before migration 12 gets the counts from its documents.
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("ALTER TABLE keyword_totals DROP COLUMN documents")
        connection.execute("DELETE FROM schema_migrations WHERE version = 12")
    upgraded = PostgresStore(postgres_url)
    try:
        assert upgraded.get_collection("c").document_count == 2  # type: ignore[union-attr]
    finally:
        upgraded.close()


def test_a_bulk_load_inside_a_transaction_of_the_caller(store: PostgresStore) -> None:
    """No VACUUM inside the caller's own transaction block (it would fail there); the index still comes."""
    with store.connection().transaction(), store.bulk_load():
        store.upsert_documents("c", _documents(5), new_collection=NEW)
    assert _has_index(store, "c") and store.chunk_count("c") == 10

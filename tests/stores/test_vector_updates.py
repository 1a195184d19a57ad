"""The SQLite vector matrix follows writes document by document, never reloading the whole collection.

Two stores on one file stand for two processes (the server's worker and `iris-rag ingest`): `reader` holds
a warm matrix, `writer` changes the collection. After each change the reader's results must equal those of
a store opened fresh on the file, while the chunk rows it read (stats()["vector_rows_read"]) grow only by
the rows of the documents written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from iris_rag.backends.sqlite import store as sqlite_store
from iris_rag.backends.sqlite import vectors
from iris_rag.backends.sqlite.store import SqliteStore, sqlite_connection
from iris_rag.stores.base import ChunkInput, DocumentInput, ScoredChunk
from iris_rag.stores.filters import parse_filters

DIM = 16
DOCUMENTS = 200
CHUNKS_PER_DOCUMENT = 3


def unit(seed: int) -> npt.NDArray[np.float32]:
    vector = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def document(doc_id: str, chunks: int, seed: int) -> DocumentInput:
    inputs = [ChunkInput(i, f"{doc_id} part {i}", 0, 1, unit(seed * 100 + i)) for i in range(chunks)]
    return DocumentInput(doc_id, "", f"{doc_id} text", {"group": seed % 3}, inputs)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "db.sqlite3"


@pytest.fixture
def pair(path: Path) -> Iterator[tuple[SqliteStore, SqliteStore]]:
    """A reader whose matrix is loaded, and a writer: two stores, one file, 200 documents of 3 chunks."""
    writer = SqliteStore(path)
    writer.create_collection("c", "model", DIM)
    writer.upsert_documents("c", [document(f"d{i}", CHUNKS_PER_DOCUMENT, i) for i in range(DOCUMENTS)])
    reader = SqliteStore(path)
    reader.vector_search("c", unit(99_999), 5)
    assert rows_read(reader) == DOCUMENTS * CHUNKS_PER_DOCUMENT
    yield reader, writer
    reader.close()
    writer.close()


def rows_read(store: SqliteStore) -> int:
    return int(store.stats()["vector_rows_read"])


def assert_same_as_fresh(store: SqliteStore, path: Path, queries: int = 5) -> None:
    """Every query ranks as on a store that loads the file whole (top 10, with and without a filter)."""
    fresh = SqliteStore(path)
    try:
        assert store.chunk_count("c") == fresh.chunk_count("c")
        for seed in range(queries):
            query = unit(10_000 + seed)
            for metadata_filter in (None, parse_filters({"group": 1})):
                ours = store.vector_search("c", query, 10, metadata_filter)
                theirs = fresh.vector_search("c", query, 10, metadata_filter)
                assert ids(ours) == ids(theirs)
                assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-6)
            some = [f"d{i}#0" for i in range(0, DOCUMENTS + 20, 7)]
            scored = store.vector_scores("c", query, some)
            assert scored == pytest.approx(fresh.vector_scores("c", query, some), abs=1e-6)
    finally:
        fresh.close()


def ids(hits: list[ScoredChunk]) -> list[str]:
    return [hit.chunk_id for hit in hits]


def test_one_document_ingest_reads_only_its_rows(pair: tuple[SqliteStore, SqliteStore], path: Path) -> None:
    reader, writer = pair
    before = rows_read(reader)

    # A new document: its two rows are read, and it is found.
    new = document("new", 2, 777)
    writer.upsert_documents("c", [new])
    hits = reader.vector_search("c", new.chunks[1].vector, 3)
    assert hits[0].chunk_id == "new#1"
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert rows_read(reader) == before + 2
    assert reader.chunk_count("c") == DOCUMENTS * CHUNKS_PER_DOCUMENT + 2

    # A document replaced by a shorter one: its one new row is read; its old rows are gone.
    writer.upsert_documents("c", [document("d5", 1, 9_999)])
    old = unit(5 * 100 + 2)  # d5#2's old vector
    assert "d5#2" not in ids(reader.vector_search("c", old, 20))
    assert rows_read(reader) == before + 3

    # A deleted document: nothing is read; its rows are gone.
    assert writer.delete_document("c", "d7")
    assert not any(h.startswith("d7#") for h in ids(reader.vector_search("c", unit(700), 50)))
    assert rows_read(reader) == before + 3
    assert reader.chunk_count("c") == DOCUMENTS * CHUNKS_PER_DOCUMENT + 2 - 2 - 3

    assert_same_as_fresh(reader, path)


def test_own_writes_update_the_matrix_in_place(path: Path) -> None:
    store = SqliteStore(path)
    store.create_collection("c", "model", DIM)
    store.upsert_documents("c", [document(f"d{i}", CHUNKS_PER_DOCUMENT, i) for i in range(DOCUMENTS)])
    store.vector_search("c", unit(99_999), 5)
    before = rows_read(store)
    store.upsert_documents("c", [document("d0", 2, 4242)])
    store.delete_document("c", "d1")
    store.vector_search("c", unit(99_999), 5)
    assert rows_read(store) == before + 2
    assert_same_as_fresh(store, path)
    store.close()


def test_many_changes_compact_and_still_match(
    pair: tuple[SqliteStore, SqliteStore], path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replacements, deletes and additions in a random order, the reader searching between them."""
    monkeypatch.setattr(vectors, "MIN_DEAD_TO_COMPACT", 8)
    monkeypatch.setattr(vectors, "MIN_SPARE_ROWS", 4)
    reader, writer = pair
    rng = np.random.default_rng(3)
    compactions, buffer = 0, reader._vector_index("c").buffer
    for step in range(40):
        doc_id = f"d{int(rng.integers(0, DOCUMENTS + 30))}"
        if rng.random() < 0.3:
            writer.delete_document("c", doc_id)
        else:
            chunks = int(rng.integers(1, 6))
            writer.upsert_documents("c", [document(doc_id, chunks, 50_000 + step)])
        reader.vector_search("c", unit(step), 5)
        current = reader._vector_index("c").buffer
        compactions += current is not buffer
        buffer = current
        if step % 10 == 9:
            assert_same_as_fresh(reader, path, queries=2)
    assert compactions > 0  # the small thresholds made it copy into new buffers
    assert rows_read(reader) < 2 * DOCUMENTS * CHUNKS_PER_DOCUMENT  # never a whole reload per write


def test_an_older_matrix_reads_what_it_always_read(pair: tuple[SqliteStore, SqliteStore]) -> None:
    """A search still running on the previous version is not disturbed by the update."""
    reader, writer = pair
    held = reader._vector_index("c")
    query = unit(31)
    scores = held.scores(query).copy()
    writer.upsert_documents("c", [document("d3", 2, 1234), document("extra", 4, 4321)])
    writer.delete_document("c", "d4")
    updated = reader._vector_index("c")
    assert updated is not held
    assert np.array_equal(held.scores(query), scores)
    assert updated.live_count == held.live_count - 1 + 4 - 3


def test_a_gap_in_the_change_log_reloads_whole(pair: tuple[SqliteStore, SqliteStore], path: Path) -> None:
    """Log rows pruned (or a version moved by a process of schema 6): the reader loads everything again."""
    reader, writer = pair
    writer.upsert_documents("c", [document("d9", 2, 999)])
    sqlite_connection(writer).execute("DELETE FROM collection_changes")
    before = rows_read(reader)
    reader.vector_search("c", unit(1), 5)
    total = DOCUMENTS * CHUNKS_PER_DOCUMENT - 1
    assert rows_read(reader) == before + total
    assert_same_as_fresh(reader, path)


def test_pruning_keeps_the_recent_log(
    pair: tuple[SqliteStore, SqliteStore], path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "CHANGE_LOG_VERSIONS", 5)
    reader, writer = pair
    for i in range(10):
        writer.upsert_documents("c", [document(f"d{i}", 1, 60_000 + i)])
    logged = sqlite_connection(writer).execute("SELECT COUNT(*) FROM collection_changes").fetchone()[0]
    assert logged <= 5 + 2  # the last five versions (a replacement is a delete and an insert)
    before = rows_read(reader)
    reader.vector_search("c", unit(1), 5)  # 20 versions behind, 5 logged: a whole reload
    assert rows_read(reader) == before + reader.chunk_count("c")
    assert_same_as_fresh(reader, path)
    before = rows_read(reader)
    writer.upsert_documents("c", [document("d20", 2, 70_000)])  # 3 chunks replaced by 2
    reader.vector_search("c", unit(1), 5)  # one write behind: incremental again
    assert rows_read(reader) == before + 2


def test_schema_6_triggers_are_replaced(path: Path) -> None:
    """A file of schema 6 has triggers that move the version without a log row: opening drops them."""
    store = SqliteStore(path)
    connection = sqlite_connection(store)
    connection.execute(
        """CREATE TRIGGER documents_version_insert AFTER INSERT ON documents BEGIN
           INSERT INTO collection_versions VALUES (NEW.collection_id, 1)
           ON CONFLICT (collection_id) DO UPDATE SET version = version + 1; END"""
    )
    store.close()
    reopened = SqliteStore(path)
    names = {
        row[0]
        for row in sqlite_connection(reopened).execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        )
    }
    assert not any(name.startswith("documents_version_") for name in names)
    assert {"documents_change_insert", "documents_change_update", "documents_change_delete"} <= names
    reopened.create_collection("c", "model", DIM)
    reopened.upsert_documents("c", [document("a", 1, 1)])
    assert reopened.data_version("c") == 1
    reopened.close()


def test_a_deleted_and_recreated_collection_reloads(
    pair: tuple[SqliteStore, SqliteStore], path: Path
) -> None:
    reader, writer = pair
    writer.delete_collection("c")
    writer.create_collection("c", "model", DIM)
    writer.upsert_documents("c", [document("z", 2, 5)])
    hits = reader.vector_search("c", unit(500), 10)
    assert ids(hits) == ["z#0", "z#1"]
    assert_same_as_fresh(reader, path)

"""The embedded store's contract: replace, delete, transactions, exact search, FTS kept in step."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iris_rag.backends.sqlite.store import SCHEMA_VERSION, SqliteStore, fts_table
from iris_rag.errors import DatabaseConnectionFailedError
from iris_rag.stores.base import CallRecord, ChunkInput, DocumentInput

DIM = 8


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _document(doc_id: str, texts: list[str], seed: int = 0, title: str = "") -> DocumentInput:
    chunks = [ChunkInput(i, t, 0, len(t), _vector(seed + i)) for i, t in enumerate(texts)]
    return DocumentInput(doc_id, title, " ".join(texts), {"k": doc_id}, chunks)


@pytest.fixture
def store(tmp_path: Path) -> SqliteStore:
    s = SqliteStore(tmp_path / "db.sqlite3")
    s.create_collection("c", "model-a", DIM)
    return s


def _fts_rows(store: SqliteStore) -> int:
    return int(store._connection().execute(f"SELECT COUNT(*) FROM {fts_table('c')}").fetchone()[0])


def test_reingest_replaces_without_duplicates(store: SqliteStore) -> None:
    store.upsert_documents("c", [_document("d1", ["one", "two", "three"])])
    first = store.get_document("c", "d1")
    store.upsert_documents("c", [_document("d1", ["only"], seed=9)])
    info = store.get_collection("c")
    assert info is not None
    assert (info.document_count, info.chunk_count) == (1, 1)
    assert _fts_rows(store) == 1
    assert [c.content for c in store.get_document_chunks("c", "d1")] == ["only"]
    second = store.get_document("c", "d1")
    assert first is not None and second is not None
    assert second.created_at == first.created_at


def test_delete_removes_chunks_vectors_and_fts(store: SqliteStore) -> None:
    store.upsert_documents("c", [_document("d1", ["a", "b"]), _document("d2", ["c"], seed=5)])
    assert store.chunk_count("c") == 3
    assert store.delete_document("c", "d1")
    assert not store.delete_document("c", "d1")
    assert store.get_document("c", "d1") is None
    assert store.chunk_count("c") == 1
    assert _fts_rows(store) == 1
    assert [h.chunk_id for h in store.vector_search("c", _vector(0), 5)] == ["d2#0"]


def test_vector_search_is_exact_and_refreshed_after_writes(store: SqliteStore) -> None:
    docs = [_document(f"d{i}", [f"text {i}"], seed=i * 10) for i in range(40)]
    store.upsert_documents("c", docs)
    query = _vector(123)
    hits = store.vector_search("c", query, 5)
    expected = sorted(((float(d.chunks[0].vector @ query), d.id) for d in docs), reverse=True)[:5]
    assert [h.chunk_id for h in hits] == [f"{doc_id}#0" for _, doc_id in expected]
    assert [round(h.score, 5) for h in hits] == [round(s, 5) for s, _ in expected]
    # A new, perfectly matching chunk must be found by the very next search.
    store.upsert_documents("c", [DocumentInput("new", "", "x", {}, [ChunkInput(0, "x", 0, 1, query)])])
    assert store.vector_search("c", query, 1)[0].chunk_id == "new#0"


def test_failed_transaction_keeps_existing_data(store: SqliteStore) -> None:
    store.upsert_documents("c", [_document("keep", ["kept text"])])
    bad = DocumentInput("bad", "", "x", {"not_json": object()}, [ChunkInput(0, "x", 0, 1, _vector(1))])
    with pytest.raises(TypeError):
        store.upsert_documents("c", [_document("new", ["new text"]), bad])
    assert store.get_document("c", "keep") is not None
    assert store.get_document("c", "new") is None, "the whole call rolled back"
    assert store.chunk_count("c") == 1


def test_get_chunks_keeps_requested_order(store: SqliteStore) -> None:
    store.upsert_documents("c", [_document("d1", ["a", "b", "c"], title="T")])
    chunks = store.get_chunks("c", ["d1#2", "missing#0", "d1#0"])
    assert [c.chunk_id for c in chunks] == ["d1#2", "d1#0"]
    assert chunks[0].title == "T"
    assert chunks[0].metadata == {"k": "d1"}


def test_call_records_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    first = SqliteStore(path)
    first.record_call(CallRecord(100.0, "rag_basic", "basic", 12.5, True, None))
    first.close()
    reopened = SqliteStore(path)
    assert reopened.calls_since(50.0) == [CallRecord(100.0, "rag_basic", "basic", 12.5, True, None)]
    assert reopened.calls_since(150.0) == []


def test_a_version_5_database_gains_collection_descriptions_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old = SqliteStore(path)
    old.create_collection("c", "model-a", DIM)
    old.upsert_documents("c", [_document("d1", ["one", "two"])])
    connection = old._connection()
    connection.execute("ALTER TABLE collections DROP COLUMN description")  # as version 5 made it
    connection.execute("PRAGMA user_version = 5")
    reopened = SqliteStore(path)
    info = reopened.get_collection("c")
    assert info is not None and info.description == "" and info.document_count == 1
    described = reopened.set_description("c", "Numbers.")
    assert described is not None and described.description == "Numbers."
    assert reopened.set_description("missing", "x") is None


def test_a_store_written_by_a_newer_release_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "newer.sqlite3"
    newer = SqliteStore(path)
    newer.create_collection("c", "model-a", DIM)
    newer._connection().execute(f"PRAGMA user_version = {SCHEMA_VERSION + 33}")
    newer.close()
    before = path.read_bytes()
    expected = rf"schema version {SCHEMA_VERSION + 33}.* up to {SCHEMA_VERSION}.*upgrade iris-rag"
    with pytest.raises(DatabaseConnectionFailedError, match=expected):
        SqliteStore(path)
    assert path.read_bytes() == before  # its version, and everything else, as the newer release left it


_SLOW_OPEN = """
import sys, time
from pathlib import Path
from iris_rag.backends.sqlite import store

real = store.SqliteStore._connection


class Slow:
    # A slow disk between reading a table's columns and adding the missing ones.
    def __init__(self, connection):
        self._connection = connection

    def __getattr__(self, name):
        return getattr(self._connection, name)

    def execute(self, sql, *args):
        found = self._connection.execute(sql, *args)
        if sql.startswith("PRAGMA table_info(embedding_cache)"):
            rows = found.fetchall()
            time.sleep(1.0)
            return iter(rows)
        return found


store.SqliteStore._connection = lambda self: Slow(real(self))
store.SqliteStore(Path(sys.argv[1])).close()
print("opened")
"""


def test_two_processes_opening_an_older_store_at_once_both_start(tmp_path: Path) -> None:
    """The upgrade tester's race: both found embedding_cache's new columns missing; the second ALTER
    failed ('duplicate column name') and that server answered DATABASE_CONNECTION_FAILED to every call."""
    path = tmp_path / "older.sqlite3"
    SqliteStore(path).close()
    older = sqlite3.connect(path)
    for column in ("collection_id", "document_id", "source_hash"):  # as version 9 had it
        older.execute("DROP INDEX IF EXISTS embedding_cache_by_document")
        older.execute(f"ALTER TABLE embedding_cache DROP COLUMN {column}")
    older.execute("PRAGMA user_version = 9")
    older.close()
    script = tmp_path / "slow_open.py"
    script.write_text(_SLOW_OPEN, encoding="utf-8")
    openers = [
        subprocess.Popen(
            [sys.executable, str(script), str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outcomes = [opener.communicate(timeout=120) for opener in openers]
    assert [out.strip() for out, _ in outcomes] == ["opened", "opened"], [err[-600:] for _, err in outcomes]

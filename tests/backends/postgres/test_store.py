"""The PostgreSQL store against a real PostgreSQL 18 with pgvector, compared with the SQLite store."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from psycopg import sql

from iris_rag.backends import create_store
from iris_rag.backends.common.bm25 import tokens
from iris_rag.backends.postgres.migrations import CHANGE_LOG_VERSIONS, MIGRATIONS, migrate
from iris_rag.backends.postgres.store import PostgresStore, ef_search
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.embedder import Embedder
from iris_rag.errors import DatabaseConnectionFailedError
from iris_rag.settings import Settings
from iris_rag.stores.base import CallRecord, ChunkInput, DocumentInput, KeywordQuery, NewCollection
from iris_rag.stores.filters import parse_filters
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage
from iris_rag.techniques.sqlrag.tables import ensure_view
from tests.backends.postgres.blocks import undo_packing
from tests.conftest import SAMPLE_CORPUS

DIMENSION = 8


def _unit(rng: np.random.Generator) -> npt.NDArray[np.float32]:
    vector = rng.standard_normal(DIMENSION).astype(np.float32)
    return vector / np.linalg.norm(vector)


def _document(
    doc_id: str, title: str, texts: list[str], rng: np.random.Generator, **metadata: object
) -> DocumentInput:
    chunks, start = [], 0
    for i, text in enumerate(texts):
        chunks.append(ChunkInput(i, text, start, start + len(text), _unit(rng)))
        start += len(text)
    return DocumentInput(doc_id, title, " ".join(texts), dict(metadata), chunks)


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    opened = PostgresStore(postgres_url)
    yield opened
    opened.close()


def _new(dimension: int = DIMENSION) -> NewCollection:
    return NewCollection("test-model", dimension)


def test_migrations_from_empty_and_idempotent_reopen(postgres_url: str) -> None:
    PostgresStore(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        recorded = [row[0] for row in connection.execute("SELECT version FROM schema_migrations ORDER BY 1")]
        assert recorded == [number for number, _, _ in MIGRATIONS]
        assert migrate(connection) == []
    second = PostgresStore(postgres_url)
    second.ping()
    second.close()


def test_upgrade_keeps_data_and_keyword_scores(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A database from before migration 2 (postings without lengths) opens with its postings scored alike.

    Its postings are then packed into blocks (migration 13).
    """
    rng = np.random.default_rng(3)
    documents = [
        _document("a", "Insulin and diabetes", ["insulin resistance in diabetes", "beta cells"], rng),
        _document("b", "", ["insulin signalling and cancer cells"], rng),
        _document("c", "Cancer", ["tumour growth", "cells divide"], rng),
    ]
    query = KeywordQuery.of(["insulin", "cells", "cancer"])
    current = PostgresStore(postgres_url)
    current.upsert_documents("c", documents, new_collection=_new())
    expected = current.keyword_search("c", query, 10)
    current.close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:  # undo migrations 13 and 2, data kept
        undo_packing(connection)
        connection.execute(
            "ALTER TABLE keyword_postings DROP CONSTRAINT keyword_postings_pkey, "
            "DROP COLUMN title_length, DROP COLUMN content_length, "
            "ADD PRIMARY KEY (collection_id, term, chunk_row)"
        )
        connection.execute("DELETE FROM schema_migrations WHERE version = 2")
    with caplog.at_level(logging.WARNING, logger="iris_rag.backends.postgres.migrations"):
        upgraded = PostgresStore(postgres_url)
    known = MIGRATIONS[-1][0]
    assert f"upgrading the PostgreSQL store to schema {known} (migrations [2, 13])" in caplog.messages
    try:
        got = upgraded.keyword_search("c", query, 10)
        assert [h.chunk_id for h in got] == [h.chunk_id for h in expected]
        assert [h.score for h in got] == pytest.approx([h.score for h in expected])
        assert len(got) == 5, "every chunk holding a term: its title counts too"
    finally:
        upgraded.close()


def test_a_database_from_before_the_change_log_reloads_then_logs(postgres_url: str) -> None:
    """Migration 14: versions moved before it have no log rows, so a reader loads whole; later ones log."""
    rng = np.random.default_rng(5)
    current = PostgresStore(postgres_url)
    current.upsert_documents("c", [_document("a", "", ["one"], rng)], new_collection=_new())
    current.close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:  # undo migration 14, data kept
        connection.execute("DROP TABLE collection_changes")
        connection.execute(
            """CREATE OR REPLACE FUNCTION bump_collection_versions() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO collection_versions AS v SELECT DISTINCT collection_id, 1 FROM changed_rows
                ON CONFLICT (collection_id) DO UPDATE SET version = v.version + 1;
                RETURN NULL;
            END $$"""
        )
        connection.execute("DELETE FROM schema_migrations WHERE version = 14")
    old = PostgresStore(postgres_url)  # migrates again
    try:
        held = old.data_version("c")
        old.upsert_documents("c", [_document("b", "", ["two"], rng)])
        now = old.data_version("c")
        assert old.changed_documents("c", 0, now, 10) is None, "versions before the log: a gap"
        assert old.changed_documents("c", held, now, 10) == {"b"}
    finally:
        old.close()


def test_documents_views_cut_to_one_name_are_rebuilt_apart(postgres_url: str) -> None:
    """Migration 15: views registered under names past 63 bytes (one real view, cut by PostgreSQL, for
    collections sharing those bytes) are dropped with their registry rows, rebuilt apart on first use."""
    rng = np.random.default_rng(7)
    ids = ["x" * 53, "x" * 53 + "bob", "x" * 53 + "alice"]  # documents_ + 53 x: 63 bytes
    current = PostgresStore(postgres_url)
    for collection_id in ids:
        current.upsert_documents(
            collection_id, [_document(collection_id, "", ["one"], rng)], new_collection=_new()
        )
        ensure_view(current.technique_storage(StructuredTableStorage), collection_id)
    current.close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:  # as built before the names fitted
        for collection_id in ids:
            connection.execute("DELETE FROM structured_tables WHERE collection_id = %s", (collection_id,))
        connection.execute("DROP SCHEMA sqlrag CASCADE")
        connection.execute("CREATE SCHEMA sqlrag")
        for collection_id in ids:  # each replaces the one before: PostgreSQL cuts every name alike
            long_name = "documents_" + collection_id
            connection.execute(
                sql.SQL(
                    "CREATE OR REPLACE VIEW {} AS SELECT id FROM public.documents WHERE collection_id = {}"
                ).format(sql.Identifier("sqlrag", long_name), sql.Literal(collection_id))
            )
            connection.execute(
                "INSERT INTO structured_tables VALUES (%s, 'documents_view', %s, %s, '[]', 1, 's', 'c', 'u')",
                (long_name, collection_id, collection_id),
            )
        connection.execute("DELETE FROM schema_migrations WHERE version = 15")
    upgraded = PostgresStore(postgres_url)  # migrates again
    try:
        storage = upgraded.technique_storage(StructuredTableStorage)
        assert storage.list_tables() == []
        assert not [n for n in storage.object_names() if n.startswith("documents_x")]
        views = [ensure_view(storage, collection_id) for collection_id in ids]
        assert len({v.name for v in views}) == 3
        for view, collection_id in zip(views, ids, strict=True):
            rows = upgraded.connection().execute(
                sql.SQL("SELECT id FROM {}").format(sql.Identifier("sqlrag", view.name))
            )
            assert rows.fetchall() == [{"id": collection_id}]
    finally:
        upgraded.close()


def test_the_change_log_keeps_the_last_versions(postgres_url: str) -> None:
    """The trigger prunes every 1,000 versions to the last CHANGE_LOG_VERSIONS (the branch runs only then)."""
    PostgresStore(postgres_url).close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("INSERT INTO collections VALUES ('c', 'm', 4, 'x', 'x')")
        for number in range(CHANGE_LOG_VERSIONS + 1000):  # one version per statement
            connection.execute(
                "INSERT INTO documents (collection_id, id, title, content, metadata, created_at, updated_at) "
                "VALUES ('c', %s, '', 'text', '{}', 'x', 'x')",
                (f"d{number}",),
            )
        row = connection.execute(
            "SELECT MIN(version), MAX(version), COUNT(*) FROM collection_changes WHERE collection_id = 'c'"
        ).fetchone()
    assert row == (1001, CHANGE_LOG_VERSIONS + 1000, CHANGE_LOG_VERSIONS)
    store = PostgresStore(postgres_url)
    try:
        last = CHANGE_LOG_VERSIONS + 1000
        assert store.changed_documents("c", 999, last, 10**6) is None, "pruned: a gap"
        assert store.changed_documents("c", last - 2, last, 10) == {f"d{last - 2}", f"d{last - 1}"}
    finally:
        store.close()


def test_concurrent_first_starts_do_not_race(postgres_url: str) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            PostgresStore(postgres_url).close()
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with psycopg.connect(postgres_url) as connection:
        count = connection.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()
    assert count == (len(MIGRATIONS),)


def test_a_database_written_by_a_newer_release_is_refused_and_left_alone(
    postgres_url: str, tmp_path: Path
) -> None:
    PostgresStore(postgres_url).close()
    newest = MIGRATIONS[-1][0]
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute(
            "INSERT INTO schema_migrations (version, description) VALUES (%s, 'from a newer release')",
            (newest + 84,),
        )
    settings = Settings(RAG_DATA_DIR=tmp_path, RAG_STORE="postgres", RAG_POSTGRES_URL=postgres_url)
    expected = rf"schema version {newest + 84}.* up to {newest}.*upgrade iris-rag"
    with pytest.raises(DatabaseConnectionFailedError, match=expected):
        create_store(settings)
    with psycopg.connect(postgres_url) as connection:
        versions = [row[0] for row in connection.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert versions == [number for number, _, _ in MIGRATIONS] + [newest + 84]


def test_upsert_replace_delete(store: PostgresStore) -> None:
    rng = np.random.default_rng(1)
    written = store.upsert_documents(
        "c",
        [_document("a", "Alpha", ["one two", "three"], rng, year=2020), _document("b", "", ["four"], rng)],
        new_collection=_new(),
    )
    assert written == 3
    info = store.get_collection("c")
    assert info is not None and (info.document_count, info.chunk_count) == (2, 3)
    version = store.data_version("c")
    assert version > 0
    created = store.get_document("c", "a")
    assert created is not None and created.metadata == {"year": 2020}
    store.upsert_documents("c", [_document("a", "Alpha 2", ["five"], rng, year=2021)])
    replaced = store.get_document("c", "a")
    assert replaced is not None and replaced.title == "Alpha 2" and replaced.created_at == created.created_at
    assert [c.content for c in store.get_document_chunks("c", "a")] == ["five"]
    assert store.data_version("c") > version
    assert [c.chunk_id for c in store.get_chunks("c", ["b#0", "zz", "a#0"])] == ["b#0", "a#0"]
    assert store.document_ids("c") == ["b", "a"]
    assert store.delete_document("c", "a") is True
    assert store.delete_document("c", "a") is False
    assert store.chunk_count("c") == 1
    assert store.term_document_counts("c") == {"four": 1}
    assert [c.id for c in store.list_collections()] == ["c"]


def test_failed_upsert_leaves_nothing(store: PostgresStore) -> None:
    rng = np.random.default_rng(2)
    bad = DocumentInput(
        "x", "t", "t", {}, [ChunkInput(0, "a", 0, 1, _unit(rng)), ChunkInput(0, "b", 1, 2, _unit(rng))]
    )
    with pytest.raises(psycopg.errors.UniqueViolation):
        store.upsert_documents("c", [bad], new_collection=_new())
    assert store.get_collection("c") is None
    store.ping()  # the thread's connection is usable again


def test_vector_search_equals_numpy_exact_top_k(store: PostgresStore) -> None:
    rng = np.random.default_rng(3)
    documents = [_document(f"d{i}", f"T{i}", [f"text {i}"], rng, n=i) for i in range(60)]
    store.upsert_documents("c", documents, new_collection=_new())
    matrix = np.stack([d.chunks[0].vector for d in documents])
    query = _unit(rng)
    expected = np.argsort(-(matrix @ query), kind="stable")[:10]
    hits = store.vector_search("c", query, 10)
    assert [h.chunk_id for h in hits] == [f"d{i}#0" for i in expected]
    np.testing.assert_allclose([h.score for h in hits], (matrix @ query)[expected], rtol=1e-5)
    scores = store.vector_scores("c", query, ["d3#0", "nope"])
    assert scores.keys() == {"d3#0"} and scores["d3#0"] == pytest.approx(float(matrix[3] @ query), rel=1e-5)
    # A filter keeps only passing documents, still exact.
    filtered = store.vector_search("c", query, 5, parse_filters({"n": {"gte": 50}}))
    allowed = [i for i in expected.tolist() + list(range(60)) if i >= 50]
    best = sorted(set(allowed), key=lambda i: -float(matrix[i] @ query))[:5]
    assert [h.chunk_id for h in filtered] == [f"d{i}#0" for i in best]


def test_vector_search_through_the_hnsw_index(store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    documents = [_document(f"d{i}", "", [f"t{i}"], rng) for i in range(200)]
    store.upsert_documents("c", documents, new_collection=_new())
    monkeypatch.setattr("iris_rag.backends.postgres.store.EXACT_SEARCH_MAX_CHUNKS", 10)
    matrix = np.stack([d.chunks[0].vector for d in documents])
    query = _unit(rng)
    # The search's query shape can use the collection's partial HNSW index (on 200 rows the planner
    # would rather sort, so the other plans are turned off to see that it is usable).
    with store.transaction() as connection:
        connection.execute("SET LOCAL enable_seqscan = off")
        connection.execute("SET LOCAL enable_bitmapscan = off")
        plan = connection.execute(
            "EXPLAIN SELECT chunk_id FROM chunks WHERE collection_id = 'c' "
            f"ORDER BY embedding::vector({DIMENSION}) <=> %s::vector({DIMENSION}) LIMIT 5",
            (str(query.tolist()),),
        ).fetchall()
    assert "chunks_hnsw_" in json.dumps(plan)
    hits = store.vector_search("c", query, 5)
    expected = np.argsort(-(matrix @ query))[:5]
    # Approximate, but on 200 vectors the graph finds the true nearest ones.
    assert {h.chunk_id for h in hits} == {f"d{i}#0" for i in expected}


def _sample_documents(embedder: Embedder, limit: int) -> list[DocumentInput]:
    rows = [json.loads(line) for line in Path(SAMPLE_CORPUS).read_text().splitlines()[:limit]]
    # Two chunks each and an untitled document now and then: both field statistics matter.
    parts = [(r["text"][: len(r["text"]) // 2], r["text"][len(r["text"]) // 2 :]) for r in rows]
    vectors = embedder.encode([text for pair in parts for text in pair])
    documents = []
    for i, (row, pair) in enumerate(zip(rows, parts, strict=True)):
        title = "" if i % 7 == 0 else row["title"]
        chunks = [ChunkInput(j, p, 0, len(p), vectors[2 * i + j]) for j, p in enumerate(pair)]
        documents.append(DocumentInput(row["_id"], title, row["text"], {"i": i}, chunks))
    return documents


@pytest.mark.parametrize("scoring", ["flat", "multifield"])
def test_keyword_scores_equal_sqlite_fts5(
    scoring: str, postgres_url: str, tmp_path: Path, embedder: Embedder
) -> None:
    documents = _sample_documents(embedder, 80)
    new = NewCollection("m", documents[0].chunks[0].vector.shape[0])
    sqlite, postgres = SqliteStore(tmp_path / "s.sqlite3"), PostgresStore(postgres_url)
    try:
        for store in (sqlite, postgres):
            store.upsert_documents("c", documents, new_collection=new)
        assert postgres.term_document_counts("c") == sqlite.term_document_counts("c")
        queries = [
            KeywordQuery.of(["cancer", "cells", "risk"], scoring=scoring),  # type: ignore[arg-type]
            KeywordQuery({"children": 2, "weight": 1}, 2.0, scoring),  # type: ignore[arg-type]
            KeywordQuery.of(["growth", "reference", "curves", "of"], 1.5, scoring),  # type: ignore[arg-type]
        ]
        for query in queries:
            expected = sqlite.keyword_search("c", query, 20)
            got = postgres.keyword_search("c", query, 20)
            assert len(expected) > 3
            assert [h.chunk_id for h in got] == [h.chunk_id for h in expected]
            for mine, theirs in zip(got, expected, strict=True):
                assert mine.score == pytest.approx(theirs.score, rel=1e-4)
        filtered = parse_filters({"i": {"lt": 40}})
        expected = sqlite.keyword_search("c", queries[0], 10, filtered)
        got = postgres.keyword_search("c", queries[0], 10, filtered)
        assert [h.chunk_id for h in got] == [h.chunk_id for h in expected]
        assert [h.score for h in got] == pytest.approx([h.score for h in expected], rel=1e-4)
        # After a delete both keep their statistics in step.
        for store in (sqlite, postgres):
            store.delete_document("c", documents[1].id)
        expected, got = (
            sqlite.keyword_search("c", queries[0], 20),
            postgres.keyword_search("c", queries[0], 20),
        )
        assert [h.score for h in got] == pytest.approx([h.score for h in expected], rel=1e-4)
    finally:
        sqlite.close()
        postgres.close()


def test_tokens_match_fts5_porter_unicode61() -> None:
    assert tokens("Running's café-au-lait, 3x faster_than the µg methodology") == [
        *("run", "s", "cafe", "au", "lait", "3x", "faster", "than", "the", "\u03bcg", "methodolog")
    ]


def test_filters(store: PostgresStore) -> None:
    rng = np.random.default_rng(5)
    store.upsert_documents(
        "c",
        [
            _document("a", "", ["x"], rng, year=2019, topic="bio", open=True, date="2020-01-05"),
            _document("b", "", ["x"], rng, year=2021, topic="geo", open=False, date="2021-06-01"),
            _document("c", "", ["x"], rng, year="2021", topic="food"),
        ],
        new_collection=_new(),
    )

    def ids(raw: dict[str, object]) -> set[str]:
        metadata_filter = parse_filters(raw)
        assert metadata_filter is not None
        return store.matching_document_ids("c", metadata_filter)

    assert ids({"year": 2021}) == {"b"}
    assert ids({"topic": {"in": ["bio", "food"]}}) == {"a", "c"}
    assert ids({"year": {"gt": 2019}}) == {"b"}
    assert ids({"year": {"gte": 2019, "lte": 2020}}) == {"a"}
    assert ids({"open": True}) == {"a"}
    assert ids({"date": {"gte": "2021-01-01"}}) == {"b"}
    assert ids({"date": {"lt": "2021-01-01"}, "topic": "bio"}) == {"a"}
    assert store.unknown_fields("c", ["year", "colour"]) == ["colour"]


def test_two_stores_on_one_database_see_each_other(postgres_url: str) -> None:
    rng = np.random.default_rng(6)
    first, second = PostgresStore(postgres_url), PostgresStore(postgres_url)
    try:
        first.upsert_documents("c", [_document("a", "", ["alpha"], rng)], new_collection=_new())
        version = second.data_version("c")
        assert second.get_document("c", "a") is not None
        second.upsert_documents("c", [_document("b", "", ["beta"], rng)])
        assert first.data_version("c") > version
        assert first.term_document_counts("c") == {"alpha": 1, "beta": 1}
    finally:
        first.close()
        second.close()


def test_cache_calls_and_stats(store: PostgresStore) -> None:
    vector = np.arange(4, dtype=np.float32)
    store.cache_embeddings("m", [(b"h1", vector, None)])
    store.cache_embeddings("m", [(b"h1", vector + 1, None)])
    cached = store.cached_embeddings("m", [b"h1", b"h2"])
    assert list(cached) == [b"h1"] and cached[b"h1"].tolist() == [1, 2, 3, 4]
    store.record_call(CallRecord(10.0, "rag_basic", "basic", 5.0, True, None))
    store.record_call(CallRecord(20.0, "rag_hyde", "hyde", 7.0, False, "TIMEOUT"))
    assert store.calls_since(15.0) == [CallRecord(20.0, "rag_hyde", "hyde", 7.0, False, "TIMEOUT")]
    stats = store.stats()
    assert stats["backend"] == "postgres" and stats["collections"] == 0


def test_connection_joins_the_open_transaction(store: PostgresStore) -> None:
    # What technique storage relies on: store.connection() inside transaction() is that transaction's.
    store.connection().execute("CREATE TABLE side (x INTEGER)")
    with pytest.raises(RuntimeError), store.transaction() as connection:
        assert store.connection() is connection
        store.connection().execute("INSERT INTO side VALUES (1)")
        raise RuntimeError
    assert store.connection().execute("SELECT COUNT(*) AS n FROM side").fetchone() == {"n": 0}
    with store.transaction():
        store.connection().execute("INSERT INTO side VALUES (2)")
    other = PostgresStore(store._url)
    try:
        assert other.connection().execute("SELECT x FROM side").fetchall() == [{"x": 2}]
    finally:
        other.close()


def test_hnsw_candidates_grow_with_the_collection() -> None:
    """200 up to 200K chunks, one per thousand chunks past that, pgvector's 1,000 at most; 2 x top_k."""
    assert [ef_search(10, chunks) for chunks in (0, 100_000, 500_000, 1_000_000, 5_000_000)] == [
        200,
        200,
        500,
        1_000,
        1_000,
    ]
    assert ef_search(300, 10_000) == 600

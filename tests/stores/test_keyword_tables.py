"""Per-collection keyword tables: names that never collide, and the migration from the old raw-id names.

Earlier versions named the tables after the raw collection id ('fts_<id>', 'vocab_<id>', 'fts_<id>:title',
'fts_<id>:content'). SQLite table names are case-insensitive, so 'A' and 'a' shared one table, and 'x_data'
is FTS5's '_data' shadow table of 'fts_x'. The store now names them from the id's hex.
"""

import logging
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import iris_rag.backends.sqlite.store as sqlite_store
from iris_rag.backends.sqlite.store import (
    SqliteStore,
    content_fts_table,
    fts_table,
    keyword_table_name,
    sqlite_connection,
    title_fts_table,
    vocabulary_table,
)
from iris_rag.service import RagService
from iris_rag.stores.base import ChunkInput, DocumentInput, KeywordQuery, KeywordScoring

DIM = 8
SCORINGS: tuple[KeywordScoring, ...] = ("flat", "multifield")

# collection → document id → (title, chunk texts). Ids differ between collections, so a leak shows.
Corpora = dict[str, dict[str, tuple[str, list[str]]]]
CASES: Corpora = {
    "A": {
        "A1": ("Upper report", ["shared apple banana", "shared cherry"]),
        "A2": ("", ["apple apple shared"]),
    },
    "a": {
        "a1": ("lower notes", ["shared apple", "zeta shared shared"]),
        "a2": ("apple title", ["omega words here"]),
    },
}
QUERIES = [
    ["shared"],
    ["apple"],
    ["shared", "apple", "cherry"],
    ["zeta", "banana"],
    ["upper", "lower"],
    ["alpha", "gamma", "delta"],
]


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _document(doc_id: str, title: str, texts: list[str]) -> DocumentInput:
    chunks = [ChunkInput(i, t, 0, len(t), _vector(i)) for i, t in enumerate(texts)]
    return DocumentInput(doc_id, title, " ".join(texts), {}, chunks)


def _ingest(store: SqliteStore, corpora: Corpora) -> None:
    for collection_id, documents in corpora.items():
        store.create_collection(collection_id, "model-a", DIM)
        store.upsert_documents(collection_id, [_document(d, t, texts) for d, (t, texts) in documents.items()])


def _search(
    store: SqliteStore, collection_id: str, terms: list[str], scoring: KeywordScoring
) -> dict[str, float]:
    hits = store.keyword_search(collection_id, KeywordQuery.of(terms, scoring=scoring), 100)
    return {h.chunk_id: h.score for h in hits}


def _results(store: SqliteStore, collection_id: str) -> dict[tuple[str, str], dict[str, float]]:
    """Every query's hits under both scorings, and the vocabulary: what a collection's keyword index says."""
    results: dict[tuple[str, str], dict[str, float]] = {
        (" ".join(terms), scoring): _search(store, collection_id, terms, scoring)
        for terms in QUERIES
        for scoring in SCORINGS
    }
    vocabulary = store.term_document_counts(collection_id)
    results[("vocabulary", "")] = {term: float(count) for term, count in vocabulary.items()}
    return results


def _chunk_ids(corpora: Corpora, collection_id: str) -> set[str]:
    return {f"{d}#{i}" for d, (_, texts) in corpora[collection_id].items() for i in range(len(texts))}


def _alone(tmp_path: Path, corpora: Corpora, collection_id: str) -> dict[tuple[str, str], dict[str, float]]:
    """The collection's results in a store that holds nothing else."""
    store = SqliteStore(tmp_path / "alone" / f"{uuid.uuid4().hex}.sqlite3")
    _ingest(store, {collection_id: corpora[collection_id]})
    results = _results(store, collection_id)
    store.close()
    return results


def _approx(results: dict[tuple[str, str], dict[str, float]]) -> Any:
    return {key: {k: pytest.approx(v, rel=1e-12) for k, v in hits.items()} for key, hits in results.items()}


def _check_isolated(store: SqliteStore, corpora: Corpora, tmp_path: Path) -> None:
    """Each collection finds only its own chunks, scored as in a store holding that collection alone."""
    for collection_id in corpora:
        results = _results(store, collection_id)
        found = {c for key, hits in results.items() if key[0] != "vocabulary" for c in hits}
        assert found and found <= _chunk_ids(corpora, collection_id), collection_id
        assert results == _approx(_alone(tmp_path, corpora, collection_id)), collection_id


def _integrity_check(store: SqliteStore, collection_id: str) -> None:
    connection = sqlite_connection(store)
    for table in (fts_table(collection_id), title_fts_table(collection_id), content_fts_table(collection_id)):
        connection.execute(f"INSERT INTO {table} ({table}) VALUES ('integrity-check')")


def test_collections_differing_only_in_case_have_their_own_keyword_index(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "db.sqlite3")
    _ingest(store, CASES)
    _check_isolated(store, CASES, tmp_path)
    before = _results(store, "a")

    # Replacing and deleting in 'A' leaves 'a' as it was: its hits, its scores (BM25 statistics), its terms.
    store.upsert_documents("A", [_document("A1", "Upper again", ["apple shared shared zeta", "new words"])])
    assert store.delete_document("A", "A2")
    assert _results(store, "a") == before
    changed: Corpora = {
        "A": {"A1": ("Upper again", ["apple shared shared zeta", "new words"])},
        "a": CASES["a"],
    }
    _check_isolated(store, changed, tmp_path)

    # ... and the other way round.
    before = _results(store, "A")
    assert store.delete_document("a", "a1")
    assert _results(store, "A") == before
    assert _search(store, "a", ["shared"], "flat") == {}
    for collection_id in CASES:
        _integrity_check(store, collection_id)


@pytest.mark.parametrize("order", ["shadow-named last", "shadow-named first"])
def test_ids_ending_in_fts5_shadow_suffixes(tmp_path: Path, order: str) -> None:
    ids = [
        "x",
        "x_data",
        "x_idx",
        "x_config",
        "x_docsize",
        "x_content",
        "x:title",
        "x:content",
        "x_data_data",
    ]
    if order == "shadow-named first":
        ids.reverse()
    corpora: Corpora = {
        cid: {f"{cid}-d": (f"title {i}", [f"shared word{i}", "shared common"])} for i, cid in enumerate(ids)
    }
    store = SqliteStore(tmp_path / "db.sqlite3")
    _ingest(store, corpora)
    _check_isolated(store, corpora, tmp_path)
    for i, cid in enumerate(ids):
        assert _search(store, cid, [f"word{i}"], "flat").keys() == {f"{cid}-d#0"}
        _integrity_check(store, cid)


def test_ids_with_quotes_spaces_and_unicode(tmp_path: Path) -> None:
    ids = [
        'we"ird',
        'We"IRD',
        "it's",
        'a "b" c',
        "with space",
        "With Space",
        " lead",
        "Ünïcödé",
        "ünïcödé",
        "日本語",
        "🙂",
        "",
    ]
    corpora: Corpora = {cid: {f"d{i}": (f"title{i}", [f"shared word{i}"])} for i, cid in enumerate(ids)}
    store = SqliteStore(tmp_path / "db.sqlite3")
    _ingest(store, corpora)
    for i, cid in enumerate(ids):
        for scoring in SCORINGS:
            assert _search(store, cid, ["shared"], scoring).keys() == {f"d{i}#0"}, (cid, scoring)
        assert store.term_document_counts(cid) == {"share": 1, f"word{i}": 1, f"title{i}": 1}
    names = {row[0] for row in sqlite_connection(store).execute("SELECT name FROM sqlite_master")}
    assert len({n.lower() for n in names}) == len(names)


def test_names_are_hex_of_the_id() -> None:
    assert keyword_table_name("Ab") == "kw_4162"
    assert fts_table("Ab") == '"kw_4162"'
    assert title_fts_table("Ab") == '"kw_4162:title"'
    assert content_fts_table("Ab") == '"kw_4162:content"'
    assert vocabulary_table("Ab") == '"kw_4162:vocab"'
    assert keyword_table_name("é") == "kw_c3a9"
    # The longest valid id (64 characters) gives a 131-character name: SQLite sets no identifier limit.
    assert len(keyword_table_name("x" * 64, ":content")) == 3 + 128 + 8


# Stores written by earlier versions
def _old(collection_id: str) -> str:
    return collection_id.replace('"', '""')


def _make_legacy(store: SqliteStore, order: list[str], field_tables: bool = True) -> None:
    """Turn a store's keyword tables into what the earlier versions wrote, statement for statement.

    Collections are created in `order` with CREATE ... IF NOT EXISTS, so 'a' after 'A' finds (and fills)
    the table of 'A', and 'x_data' after 'x' finds the shadow table of 'fts_x' (its ingest failed, so
    only collections whose table is their own get rows). field_tables False: a store from before
    multifield BM25.
    """
    connection = sqlite_connection(store)
    for collection_id in order:
        for suffix in (":vocab", ":title", ":content", ""):
            connection.execute(f'DROP TABLE "{keyword_table_name(collection_id, suffix)}"')
    for collection_id in order:
        fts = f'"fts_{_old(collection_id)}"'
        shadow = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE lower(name) = lower(?) AND sql NOT LIKE 'CREATE VIRTUAL%'",
            (f"fts_{collection_id}",),
        ).fetchone()
        create = "CREATE VIRTUAL TABLE IF NOT EXISTS"
        connection.execute(f"{create} {fts} USING fts5(title, content, tokenize = 'porter unicode61')")
        connection.execute(f"{create} \"vocab_{_old(collection_id)}\" USING fts5vocab({fts}, 'row')")
        title, content = f'"fts_{_old(collection_id)}:title"', f'"fts_{_old(collection_id)}:content"'
        if field_tables:
            connection.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {title} USING fts5(title, tokenize = 'porter unicode61')"
            )
            connection.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {content} USING fts5(content, content = 'chunks', "
                "content_rowid = 'rowid', tokenize = 'porter unicode61')"
            )
        rows = connection.execute(
            """SELECT k.rowid, d.title, k.content FROM chunks k JOIN documents d
               ON d.collection_id = k.collection_id AND d.id = k.document_id WHERE k.collection_id = ?""",
            (collection_id,),
        ).fetchall()
        if shadow is not None:
            assert not rows, "the old version could not ingest into a shadow table"
        for rowid, title_text, text in rows:
            connection.execute(
                f"INSERT INTO {fts} (rowid, title, content) VALUES (?, ?, ?)", (rowid, title_text, text)
            )
            if field_tables:
                if title_text.strip():
                    connection.execute(
                        f"INSERT INTO {title} (rowid, title) VALUES (?, ?)", (rowid, title_text)
                    )
                connection.execute(f"INSERT INTO {content} (rowid, content) VALUES (?, ?)", (rowid, text))
    store.close()


def _schema(path: Path) -> list[tuple[Any, ...]]:
    """Every schema row with its root page: a table dropped and made again shows."""
    with closing(sqlite3.connect(path)) as connection:
        return connection.execute(
            "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master ORDER BY name"
        ).fetchall()


def _legacy_names(path: Path) -> list[str]:
    with closing(sqlite3.connect(path)) as connection:
        rows = connection.execute(
            "SELECT name FROM sqlite_master "
            "WHERE name LIKE 'fts\\_%' ESCAPE '\\' OR name LIKE 'vocab\\_%' ESCAPE '\\'"
        ).fetchall()
    return sorted(row[0] for row in rows)


@pytest.mark.parametrize("field_tables", [True, False], ids=["with field tables", "before multifield"])
def test_migration_rebuilds_case_sharing_collections_from_their_rows(
    tmp_path: Path, field_tables: bool
) -> None:
    path = tmp_path / "db.sqlite3"
    corpora: Corpora = {**CASES, "c": {"c1": ("other", ["shared apple elsewhere"])}}
    store = SqliteStore(path)
    _ingest(store, corpora)
    _make_legacy(store, ["A", "a", "c"], field_tables)
    # The old layout as it was: one table for 'A' and 'a', holding both collections' chunks.
    with closing(sqlite3.connect(path)) as connection:
        shared = connection.execute('SELECT COUNT(*) FROM "fts_a"').fetchone()[0]
    assert shared == 3 + 3
    assert _legacy_names(path)

    migrated = SqliteStore(path)
    assert _legacy_names(path) == []
    _check_isolated(migrated, corpora, tmp_path)
    for collection_id in corpora:
        _integrity_check(migrated, collection_id)
    migrated.close()

    # Again: nothing changes (no table made again, no row written).
    schema = _schema(path)
    again = SqliteStore(path)
    connection = again.connection()
    changes = connection.total_changes
    again._migrate(connection)
    assert connection.total_changes == changes
    assert _schema(path) == schema
    _check_isolated(again, corpora, tmp_path)

    # And the migrated collections take writes: 'a' changes, 'A' does not.
    before = _results(again, "A")
    again.upsert_documents("a", [_document("a3", "apple", ["shared banana"])])
    assert _results(again, "A") == before
    assert _search(again, "a", ["banana"], "multifield").keys() == {"a3#0"}


def test_migration_is_one_transaction_per_collection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "db.sqlite3"
    corpora: Corpora = {"c1": {"d1": ("one", ["alpha beta"])}, "c2": {"d2": ("two", ["alpha gamma"])}}
    store = SqliteStore(path)
    _ingest(store, corpora)
    _make_legacy(store, ["c1", "c2"])
    old_c2 = [name for name in _legacy_names(path) if "c2" in name]
    assert len(old_c2) == 4 + 3 * 5 - 1  # the tables and their shadows (none for external content)

    real = sqlite_store._drop_legacy_tables

    def crash_on_c2(connection: sqlite3.Connection, collection_id: str) -> int:
        dropped = real(connection, collection_id)
        if collection_id == "c2":
            raise RuntimeError("crash after the new tables were built and the old ones dropped")
        return dropped

    monkeypatch.setattr(sqlite_store, "_drop_legacy_tables", crash_on_c2)
    with pytest.raises(RuntimeError, match="crash"):
        SqliteStore(path)
    # c1 is done; c2 is exactly as the old version left it, and its old table still answers.
    assert _legacy_names(path) == old_c2
    with closing(sqlite3.connect(path)) as connection:
        names = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        hits = connection.execute('SELECT rowid FROM "fts_c2" WHERE "fts_c2" MATCH \'gamma\'').fetchall()
    assert keyword_table_name("c1") in names and keyword_table_name("c2") not in names
    assert len(hits) == 1

    monkeypatch.setattr(sqlite_store, "_drop_legacy_tables", real)
    reopened = SqliteStore(path)
    assert _legacy_names(path) == []
    _check_isolated(reopened, corpora, tmp_path)


def test_an_upgrade_says_on_stderr_what_it_does_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The upgrade tester's store of schema 2 (200K chunks): its keyword tables took 15-21 s to rebuild at
    the first start, and the CLI (warnings only) and the MCP server's log said nothing meanwhile."""
    path = tmp_path / "db.sqlite3"
    corpora: Corpora = {
        "c1": {"d1": ("one", ["alpha beta"])},
        "c2": {"d2": ("two", ["alpha gamma", "delta"])},
    }
    store = SqliteStore(path)
    _ingest(store, corpora)
    _make_legacy(store, ["c1", "c2"])
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA user_version = 2")  # the raw-id keyword tables were schema 2's
    monkeypatch.setattr(sqlite_store, "UPGRADE_PROGRESS_S", 0.0, raising=False)  # each check reports
    with caplog.at_level(logging.WARNING, logger=sqlite_store.__name__):
        SqliteStore(path).close()
    said = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert said[0] == (
        f"upgrading the SQLite store {path} from schema 2 to {sqlite_store.SCHEMA_VERSION} "
        "(a large store takes minutes; one stopped goes on at the next start)"
    )
    assert "rebuilding the keyword tables of 'c1' (collection 1 of 2, 1 chunks)" in said
    assert "rebuilding the keyword tables of 'c2' (collection 2 of 2, 2 chunks)" in said
    assert any(line.startswith("still rebuilding the keyword tables of 'c2': ") for line in said), said
    assert said[-1].startswith(
        f"upgraded the SQLite store {path} to schema {sqlite_store.SCHEMA_VERSION} in "
    )

    caplog.clear()  # opened again, or opened new: nothing to say
    with caplog.at_level(logging.WARNING, logger=sqlite_store.__name__):
        SqliteStore(path).close()
        SqliteStore(tmp_path / "new.sqlite3").close()
    assert caplog.records == []


def test_migration_of_a_collection_named_after_a_shadow_table(tmp_path: Path) -> None:
    # The old version made 'x_data' after 'x': its FTS table was the shadow table 'fts_x_data', so it
    # never took a document. The migration must not drop that shadow table on its own, nor fail on it.
    path = tmp_path / "db.sqlite3"
    corpora: Corpora = {"x": {"x1": ("ex", ["alpha beta", "beta gamma"])}, "x_data": {}}
    store = SqliteStore(path)
    _ingest(store, corpora)
    _make_legacy(store, ["x", "x_data"])
    with (
        closing(sqlite3.connect(path)) as connection,
        pytest.raises(sqlite3.OperationalError, match="no column named"),
    ):
        connection.execute("INSERT INTO \"fts_x_data\" (title, content) VALUES ('t', 'c')")

    migrated = SqliteStore(path)
    assert _legacy_names(path) == []
    migrated.upsert_documents("x_data", [_document("xd1", "data", ["alpha delta"])])
    corpora["x_data"] = {"xd1": ("data", ["alpha delta"])}
    _check_isolated(migrated, corpora, tmp_path)
    assert _search(migrated, "x", ["alpha"], "flat").keys() == {"x1#0"}
    assert _search(migrated, "x_data", ["alpha"], "flat").keys() == {"xd1#0"}


def test_a_collection_written_meanwhile_with_old_names_is_built_on_first_read(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    open_store = SqliteStore(path)
    other = SqliteStore(path)  # another process, an earlier version: its collection has the old names
    _ingest(other, {"late": {"l1": ("late", ["alpha beta"])}})
    _make_legacy(other, ["late"])
    for scoring in SCORINGS:
        assert _search(open_store, "late", ["alpha"], scoring).keys() == {"l1#0"}
    assert open_store.term_document_counts("late") == {"alpha": 1, "beta": 1, "late": 1}
    assert _legacy_names(path) == []


def test_rag_hybrid_ifind_keyword_leg_stays_in_its_collection(service: RagService) -> None:
    # The same document id in both: a chunk leaked from 'Docs' would pass for one of 'docs'.
    upper = {"id": "same", "title": "Ketamine", "content": "Ketamine doses in surgery."}
    lower = {"id": "same", "title": "Weather", "content": "Rain and wind today."}
    service.ingest({"collection_id": "Docs", "documents": [upper]})
    service.ingest({"collection_id": "docs", "documents": [lower]})

    def keyword_hits(collection_id: str, query: str) -> list[str]:
        arguments: dict[str, Any] = {
            "query": query,
            "collection_id": collection_id,
            "technique_params": {"vector_weight": 0.0, "keyword_weight": 1.0},
            "options": {"generate": False, "top_k": 5},
        }
        result = service.execute({"technique": "hybrid_ifind", "arguments": arguments})
        return [d["title"] for d in result["retrieved_documents"]]

    assert keyword_hits("Docs", "ketamine") == ["Ketamine"]
    assert keyword_hits("docs", "ketamine") == []
    assert keyword_hits("docs", "rain wind") == ["Weather"]
    assert keyword_hits("Docs", "rain wind") == []

"""The storage contract of rag_sqlrag, driven through DocumentStore.technique_storage only.

Written against StructuredTableStorage and DocumentStore alone, so that the same tests run on every backend
that implements them (the `store` fixture's params).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from iris_rag.errors import InvalidParametersError, SqlRejectedError
from iris_rag.stores.base import ChunkInput, DocumentInput, DocumentStore, NewCollection
from iris_rag.techniques.sqlrag.safety import SqlGate, check_sql, select_limits
from iris_rag.techniques.sqlrag.storage import CheckedSql, NewTable, SqlResult, StructuredTableStorage
from iris_rag.techniques.sqlrag.tables import (
    DocumentViews,
    build_table,
    ensure_view,
    ingest_table,
    parse_records,
    refresh_view,
)

DIMENSION = 4


@pytest.fixture
def store(any_store: DocumentStore) -> DocumentStore:
    """A fresh store of each backend (tests/conftest.py: sqlite and postgres)."""
    return any_store


def storage_of(store: DocumentStore) -> StructuredTableStorage:
    return store.technique_storage(StructuredTableStorage)


def registered_views(store: DocumentStore) -> DocumentViews:
    """rag_sqlrag's technique index, kept in step with every later upsert and delete."""
    views = DocumentViews(store)
    store.register_index(views)
    return views


def document(doc_id: str, metadata: dict[str, Any]) -> DocumentInput:
    content = f"document {doc_id}"
    vector = np.full(DIMENSION, 0.5, dtype=np.float32)
    chunk = ChunkInput(0, content, 0, len(content), vector)
    return DocumentInput(doc_id, f"title {doc_id}", content, metadata, [chunk])


def ingest(store: DocumentStore, views: DocumentViews, collection_id: str, docs: list[DocumentInput]) -> None:
    """What the ingestor does: prepare outside the transaction, write inside the store's upsert."""
    prepared = {views.name: views.prepare(collection_id, docs)}
    store.upsert_documents(
        collection_id, docs, prepared, new_collection=NewCollection("test-model", DIMENSION)
    )


def select(storage: StructuredTableStorage, sql: str, allowed: list[str], views: list[str]) -> list[Any]:
    checked = check_sql(
        sql,
        dialect=storage.dialect,
        allowed=allowed,
        registered=[t.name for t in storage.list_tables()],
        existing=storage.object_names(),
        complexity="moderate",
        max_rows=100,
    )
    limits = select_limits(allowed, views, allow_recursive=False, timeout_ms=2000)
    return storage.run_select(checked, limits, SqlGate()).rows


def test_a_table_is_stored_replaced_and_queried(store: DocumentStore) -> None:
    storage = storage_of(store)
    assert storage is storage_of(store), "one storage object per store"
    rows = [{"region": "north", "amount": 10.5, "day": "2024-01-02"}, {"region": "south", "amount": 7}]
    first = ingest_table(storage, "Sales", parse_records(rows), collection_id=None, source="rows")
    assert first["sql_name"] == "t_sales" and first["replaced"] is False
    info = storage.get_table("T_SALES")
    assert info is not None and info.kind == "table" and info.row_count == 2
    assert [(c.name, c.type) for c in info.columns] == [
        ("region", "TEXT"),
        ("amount", "REAL"),
        ("day", "DATE"),
    ]
    assert storage.samples(info, 5) == [["north", "south"], [10.5, 7.0], ["2024-01-02"]]
    assert "t_sales" in storage.object_names()
    got = select(storage, "SELECT region, amount FROM t_sales ORDER BY amount", ["t_sales"], [])
    assert got == [["south", 7.0], ["north", 10.5]]

    second = ingest_table(storage, "sales", parse_records([{"x": 1}]), collection_id=None, source="again")
    assert second["replaced"] is True
    replaced = storage.get_table("t_sales")
    assert replaced is not None and replaced.created_at == info.created_at and replaced.source == "again"
    assert select(storage, "SELECT * FROM t_sales", ["t_sales"], []) == [[1]]
    assert storage.counts() == {"table": 1}


def test_a_failed_replace_leaves_the_old_table(store: DocumentStore) -> None:
    storage = storage_of(store)
    ingest_table(storage, "kept", parse_records([{"a": 1}]), collection_id=None, source="first")
    ingest(store, registered_views(store), "docs", [document("d", {"k": 1})])
    view = storage.view_for("docs")
    assert view is not None
    # A table may not take the name of an object that is not a structured table (here the view).
    columns, rows = build_table(parse_records([{"b": 2}]))
    with pytest.raises(InvalidParametersError, match="not a structured table"):
        storage.replace_table(NewTable(view.name, "x", None, columns, rows, "clash"), lambda _: None)
    assert storage.view_for("docs") == view
    # The table to be replaced is shown to may_replace first (the technique's ownership check), which
    # refuses by raising: nothing changes.
    kept = storage.get_table("t_kept")
    shown: list[object] = []

    def refuse(existing: object) -> None:
        shown.append(existing)
        raise RuntimeError("not yours")

    with pytest.raises(RuntimeError, match="not yours"):
        storage.replace_table(NewTable("t_kept", "kept", "docs", columns, rows, "again"), refuse)
    assert shown == [kept] and storage.get_table("t_kept") == kept
    with pytest.raises(InvalidParametersError, match="is shared by every collection"):
        ingest_table(storage, "kept", parse_records([{"b": 2}]), collection_id="docs", source="again")
    assert select(storage, "SELECT a FROM t_kept", ["t_kept"], []) == [[1]]


def test_views_follow_ingests_deletes_and_roll_back_with_them(store: DocumentStore) -> None:
    views = registered_views(store)
    storage = views.storage
    ingest(store, views, "docs", [document("a", {"year": 2019}), document("b", {"year": 2020})])
    view = storage.view_for("docs")
    assert view is not None and view.name == "documents_docs" and view.row_count == 2
    assert [c.name for c in view.columns] == ["id", "title", "created_at", "updated_at", "year"]
    assert views.indexed_documents("docs") == 2 and views.stats() == {"tables": 0, "documents_views": 1}
    query = "SELECT id, year FROM documents_docs ORDER BY id"
    assert select(storage, query, [view.name], [view.name]) == [["a", 2019], ["b", 2020]]

    # Deleting a document takes its row out of the view (the view reads the documents).
    assert store.delete_document("docs", "b")
    assert storage.document_count("docs") == 1
    assert select(storage, query, [view.name], [view.name]) == [["a", 2019]]

    # An ingest that fails after the view was refreshed leaves view and registry as they were.
    class Failing:
        name = "failing"

        def prepare(self, collection_id: str, documents: list[DocumentInput]) -> None:
            return None

        def write(self, collection_id: str, documents: list[DocumentInput], prepared: Any) -> None:
            raise RuntimeError("boom")

        def delete(self, collection_id: str, document_id: str) -> None:
            return None

        def stats(self) -> dict[str, Any]:
            return {}

        def indexed_documents(self, collection_id: str) -> int:
            return 0

    store.register_index(Failing())
    docs = [document("c", {"journal": "Nature"})]
    with pytest.raises(RuntimeError, match="boom"):
        store.upsert_documents("docs", docs, {views.name: views.prepare("docs", docs), "failing": None})
    assert storage.view_for("docs") == view, "no new column, same count and timestamps"
    assert storage.document_count("docs") == 1


def test_own_transaction_commits_or_rolls_back(store: DocumentStore) -> None:
    storage = storage_of(store)
    store.create_collection("old", "test-model", DIMENSION)
    store.upsert_documents("old", [document("o", {"colour": "red"})])
    assert storage.view_for("old") is None, "no prepared rows: as if ingested before rag_sqlrag"
    assert storage.document_metadata("old") == [{"colour": "red"}]

    with pytest.raises(RuntimeError), storage.transaction():
        refresh_view(storage, "old", {"colour": "TEXT"})
        assert storage.view_for("old") is not None, "visible inside its own transaction"
        raise RuntimeError
    assert storage.view_for("old") is None

    built = ensure_view(storage, "old")
    assert built.name == "documents_old" and built.columns[-1].name == "colour"
    assert ensure_view(storage, "old") == built, "built once"
    rows = select(storage, "SELECT id, colour FROM documents_old", [built.name], [built.name])
    assert rows == [["o", "red"]]


def test_the_run_is_contained_whatever_passed_the_check(store: DocumentStore) -> None:
    storage = storage_of(store)
    ingest_table(storage, "open", parse_records([{"a": 1}]), collection_id=None, source="s")
    ingest_table(storage, "closed", parse_records([{"secret": "s3"}]), collection_id=None, source="s")
    limits = select_limits(["t_open"], [], allow_recursive=False, timeout_ms=500)
    unchecked = "SELECT secret FROM t_closed"
    with pytest.raises(SqlRejectedError) as caught:
        storage.run_select(CheckedSql(unchecked, unchecked, (), (), {}, None, 10, 11), limits, SqlGate())
    assert caught.value.details["stage"] == "execution"
    assert "t_closed" in caught.value.details["reason"]
    loop = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    recursive = select_limits([], [], allow_recursive=True, timeout_ms=100)
    with pytest.raises(SqlRejectedError, match="100 ms time limit"):
        storage.run_select(CheckedSql(loop, loop, (), ("c",), {}, None, 10, 11), recursive, SqlGate())


def test_long_collection_ids_get_views_of_their_own(store: DocumentStore) -> None:
    """Names fit PostgreSQL's 63 bytes, so two long ids sharing their first 53 characters stay apart.

    Security report, defect 3: PostgreSQL cut both views' names to one identifier, so one collection's view
    read the other's documents, and deleting one collection dropped the other's view.
    """
    views = registered_views(store)
    storage = views.storage
    prefix = "x" * 53
    ingest(store, views, prefix + "bob", [document("bob-doc", {})])
    ingest(store, views, prefix + "alice", [document("alice-doc", {})])
    bob, alice = storage.view_for(prefix + "bob"), storage.view_for(prefix + "alice")
    assert bob is not None and alice is not None and bob.name != alice.name
    for view, expected in ((bob, "bob-doc"), (alice, "alice-doc")):
        assert len(view.name.encode()) <= 63 and view.name.startswith("documents_xxx")
        assert view.name in storage.object_names(), "stored under the name the registry gives"
        assert select(storage, f"SELECT id FROM {view.name}", [view.name], [view.name]) == [[expected]]

    store.delete_collection(prefix + "alice")
    assert storage.view_for(prefix + "bob") == bob
    assert select(storage, f"SELECT id FROM {bob.name}", [bob.name], [bob.name]) == [["bob-doc"]]


def test_long_column_names_stay_apart(store: DocumentStore) -> None:
    """Column names that share their first 63 bytes (PostgreSQL's limit) are distinct columns."""
    storage = storage_of(store)
    long = "é" * 40  # 80 bytes in UTF-8
    ingest_table(
        storage, "wide", parse_records([{long + "a": 1, long + "b": 2}]), collection_id=None, source="s"
    )
    info = storage.get_table("t_wide")
    assert info is not None
    names = [c.name for c in info.columns]
    assert len(set(names)) == 2 and all(len(n.encode()) <= 63 for n in names)
    quoted = ", ".join(f'"{n}"' for n in names)
    assert select(storage, f"SELECT {quoted} FROM t_wide", ["t_wide"], []) == [[1, 2]]


def test_a_result_past_the_size_budget_is_cut_while_fetching(store: DocumentStore) -> None:
    """Rows past limits.max_result_bytes are not fetched: the rows before are kept, marked truncated."""
    storage = storage_of(store)
    records = [{"n": i, "v": "x" * 1_000} for i in range(50)]
    ingest_table(storage, "wide", parse_records(records), collection_id=None, source="s")

    def run(sql: str, budget: int, max_rows: int = 100) -> SqlResult:
        checked = check_sql(
            sql,
            dialect=storage.dialect,
            allowed=["t_wide"],
            registered=[t.name for t in storage.list_tables()],
            existing=storage.object_names(),
            complexity="moderate",
            max_rows=max_rows,
        )
        limits = select_limits(["t_wide"], [], allow_recursive=False, timeout_ms=2000)
        return storage.run_select(checked, replace(limits, max_result_bytes=budget), SqlGate())

    # Each row is about 1,010 bytes as JSON ([n, "xxx..."]): ten fit in 10,500 bytes, the eleventh does not.
    cut = run("SELECT n, v FROM t_wide ORDER BY n", 10_500)
    assert [row[0] for row in cut.rows] == list(range(10))
    assert cut.truncated and cut.truncated_by == "max_result_bytes"
    by_rows = run("SELECT n, v FROM t_wide ORDER BY n", 10_500, max_rows=3)
    assert len(by_rows.rows) == 3 and by_rows.truncated_by == "max_rows"
    whole = run("SELECT n FROM t_wide ORDER BY n", 10_500)
    assert len(whole.rows) == 50 and not whole.truncated and whole.truncated_by is None
    # Not even one row fits: refused, rather than an empty result that looks like no match.
    with pytest.raises(SqlRejectedError, match="result size limit") as caught:
        run("SELECT v FROM t_wide", 500)
    assert caught.value.details["stage"] == "execution"

"""The IRIS store under IRIS's documented rules, on a test double of the driver (iris_double.py).

No IRIS server runs on these machines: what these tests show is that the store's SQL is right under the rules
the double copies from InterSystems' documentation (collation, LOCK/UNLOCK, VARCHAR and subscript limits,
isolation, rowcount), not that a live server agrees.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.backends.iris import schema
from iris_rag.backends.iris import store as store_module
from iris_rag.backends.iris.colbert import IrisTokenVectors
from iris_rag.backends.iris.store import IrisLockTimeoutError, IrisStore, IrisTarget
from iris_rag.stores.base import (
    CallFilter,
    CallRecord,
    ChunkInput,
    DocumentInput,
    KeywordQuery,
    NewCollection,
)
from iris_rag.techniques.colbert.storage import TokenRow
from tests.backends.iris.iris_double import Cursor, Server, install, listening_port

VECTOR = np.full(4, 0.5, dtype=np.float32)


def _document(document_id: str, text: str) -> DocumentInput:
    return DocumentInput(document_id, document_id, text, {}, [ChunkInput(0, text, 0, len(text), VECTOR)])


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Server:
    return install(tmp_path / "iris.sqlite3", monkeypatch)


@pytest.fixture
def target() -> Iterator[IrisTarget]:
    with listening_port() as port:
        yield IrisTarget("127.0.0.1", port)


@pytest.fixture
def store(server: Server, target: IrisTarget) -> Iterator[IrisStore]:
    opened = IrisStore(target)
    yield opened
    opened.close()


def test_ids_that_differ_only_in_case_are_different_documents_and_collections(store: IrisStore) -> None:
    """Under IRIS's default SQLUPPER collation 'README.md' and 'readme.md' were one key."""
    store.upsert_documents(
        "notes",
        [_document("README.md", "upper case file"), _document("readme.md", "lower case file")],
        new_collection=NewCollection("m", 4),
    )
    assert store.document_ids("notes") == ["README.md", "readme.md"]
    found = store.get_document("notes", "README.md")
    assert found is not None and found.content == "upper case file"
    assert store.create_collection("Notes", "m", 4).id == "Notes"
    assert [c.id for c in store.list_collections()] == ["Notes", "notes"]
    assert store.get_collection("NOTES") is None
    assert store.document_ids("Notes") == []
    assert store.delete_document("notes", "README.MD") is False


def test_grouped_and_distinct_values_come_back_as_written(store: IrisStore) -> None:
    """GROUP BY and DISTINCT on an SQLUPPER column give the upper-cased value."""
    store.upsert_documents("c", [_document("Doc-A", "keyword text")], new_collection=NewCollection("m", 4))
    assert set(store.term_document_counts("c")) == {"a", "doc", "keyword", "text"}
    tokens = IrisTokenVectors(store)
    with store.transaction():
        tokens.insert("c", [TokenRow("Doc-A#0", "Doc-A", 1, 4, 1.0, b"\x01\x00", b"\x01\x02\x03\x04")])
    assert tokens.indexed_document_ids("c") == {"Doc-A"}
    assert tokens.totals().documents == 1


def test_a_store_of_schema_5_moves_to_exact_collation(
    server: Server, target: IrisTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 6 sets EXACT on an old store's columns, builds its indexes again and keeps every row reachable."""
    old_steps = [step for step in schema.MIGRATIONS if step[0] < schema.EXACT_COLLATION_STEP]
    with monkeypatch.context() as old:
        old.setattr(store_module, "MIGRATIONS", old_steps)
        old.setattr(
            store_module,
            "vector_table_ddl",
            lambda d: [s.replace(" COLLATE EXACT", "") for s in schema.vector_table_ddl(d)],
        )
        before = IrisStore(target)
        before.upsert_documents("Notes", [_document("a.md", "alpha")], new_collection=NewCollection("m", 4))
        # Under SQLUPPER this write reached 'Notes', its rows spelled 'notes'.
        before.upsert_documents("notes", [_document("b.md", "beta")])
        before.close()
    after = IrisStore(target)
    try:
        assert any("BUILD INDEX FOR TABLE IrisRag.Vectors4" in s for s in server.statements)
        assert [c.id for c in after.list_collections()] == ["Notes"]
        assert after.document_ids("Notes") == ["a.md", "b.md"]
        assert after.keyword_search("Notes", KeywordQuery({"beta": 1}), 5)[0].chunk_id.startswith("b.md")
        assert after.vector_scores("Notes", VECTOR, ["b.md#0"]) != {}
        after.upsert_documents("Notes", [_document("A.md", "other alpha")])
        assert after.document_ids("Notes") == ["a.md", "b.md", "A.md"]
    finally:
        after.close()


def test_a_store_of_schema_6_keeps_its_call_log_and_records_the_callers_ids(
    server: Server, target: IrisTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 7 adds request_id and session_id to the Calls table; the records already there stay, without."""
    old = CallRecord(1_000.0, "rag_basic", "basic", 5.0, True, None, "alice")
    with monkeypatch.context() as before_step_7:
        before_step_7.setattr(store_module, "MIGRATIONS", [s for s in schema.MIGRATIONS if s[0] < 7])
        IrisStore(target).close()
        written = server.connect()  # as the release before step 7 wrote a call record
        written.cursor().execute(
            "INSERT INTO IrisRag.Calls (ts, tool, technique, duration_ms, success, error_code, principal) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [1_000.0, "rag_basic", "basic", 5.0, 1, None, "alice"],
        )
        written.commit()
        written.close()
    after = IrisStore(target)
    try:
        named = CallRecord(1_001.0, "rag_basic", "basic", 6.0, True, None, "alice", "req-1", "session-1")
        after.record_call(named)
        assert after.recent_calls(CallFilter(0), 5) == [named, old]
        assert any("ADD request_id" in statement for statement in server.statements)
    finally:
        after.close()


def test_the_vector_functions_follow_the_reference(server: Server) -> None:
    """The double's TO_VECTOR pads or cuts to the length; VECTOR_COSINE refuses vectors of two lengths."""
    cursor = server.connect().cursor()
    cursor.execute(
        "SELECT VECTOR_COSINE(TO_VECTOR(?, FLOAT, 3), TO_VECTOR(?, FLOAT, 3))", ["[1,0]", "1,0,0,9"]
    )
    assert cursor.fetchall() == [(1.0,)]
    cursor.execute(
        "SELECT VECTOR_DOT_PRODUCT(TO_VECTOR(?, FLOAT, 2), TO_VECTOR(?, FLOAT, 2))", ["2,3", "4,5"]
    )
    assert cursor.fetchall() == [(23.0,)]
    with pytest.raises(RuntimeError, match="<-257>"):
        cursor.execute(
            "SELECT VECTOR_COSINE(TO_VECTOR(?, FLOAT, 2), TO_VECTOR(?, FLOAT, 3))", ["1,0", "1,0,0"]
        )


def test_a_second_process_opens_the_store_while_the_first_holds_it(
    server: Server, target: IrisTarget
) -> None:
    """An explicit LOCK outlives COMMIT: the schema lock must be released, or other processes wait 10 s."""
    first = IrisStore(target)  # the long-lived MCP worker
    try:
        second = IrisStore(target)  # `iris-rag ingest` in another process
        second.close()
        assert server.table_locks == {}
    finally:
        first.close()


def test_a_failed_schema_step_releases_the_lock(
    server: Server, target: IrisTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = [*schema.MIGRATIONS, (99, "a step that fails", ["INSERT INTO IrisRag.Missing (x) VALUES (1)"])]
    monkeypatch.setattr(store_module, "MIGRATIONS", broken)
    with pytest.raises(Exception, match="no such table"):
        IrisStore(target)
    assert server.table_locks == {}


def test_a_failed_schema_step_is_the_error_raised_even_when_the_unlock_fails(
    server: Server, target: IrisTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The UNLOCK after it may fail too (the connection in trouble): it must not hide why the step failed."""
    broken = [*schema.MIGRATIONS, (99, "a step that fails", ["INSERT INTO IrisRag.Missing (x) VALUES (1)"])]
    monkeypatch.setattr(store_module, "MIGRATIONS", broken)
    run = Cursor._run

    def unlock_fails(cursor: Cursor, statement: str, many: list[list[Any]]) -> None:
        if statement.startswith("UNLOCK TABLE"):
            raise RuntimeError("[SQLCODE: <-400>] the unlock failed")
        run(cursor, statement, many)

    monkeypatch.setattr(Cursor, "_run", unlock_fails)
    with pytest.raises(Exception, match="no such table"):
        IrisStore(target)


def test_a_lock_held_past_the_timeout_is_a_retryable_error(server: Server, target: IrisTarget) -> None:
    IrisStore(target).close()
    server.table_locks["IrisRag.Migrations"] = 0  # another process holds it
    with pytest.raises(IrisLockTimeoutError, match="retry") as refused:
        IrisStore(target)
    assert refused.value.code == "TIMEOUT_EXCEEDED"


def test_every_connection_reads_committed_rows_only(server: Server, store: IrisStore) -> None:
    """IRIS's default is READ UNCOMMITTED: a reader could cache a write that is then rolled back."""
    store.ping()
    assert server.connections and all(c.isolation == "READ COMMITTED" for c in server.connections)


def test_writes_do_not_depend_on_the_driver_rowcount(store: IrisStore) -> None:
    """The driver's rowcount is not reliable (-1 here): versions, deletes and descriptions do without it."""
    store.upsert_documents("c", [_document("a", "one")], new_collection=NewCollection("m", 4))
    store.upsert_documents("c", [_document("b", "two")])
    assert store.data_version("c") == 2
    assert store.delete_document("c", "missing") is False
    assert store.data_version("c") == 2
    assert store.delete_document("c", "a") is True
    assert store.set_description("absent", "text") is None
    described = store.set_description("c", "text")
    assert described is not None and described.description == "text"


def test_over_long_terms_are_left_out_of_the_keyword_index(store: IrisStore) -> None:
    """The tokenizer keeps a hex dump or an unpunctuated CJK run whole: past VARCHAR(512) or 511 bytes."""
    hexdump = "deadbeef" * 80  # 640 characters
    cjk = "我们今天讨论的是一个关于信息检索系统的问题它需要处理中文文本" * 10  # 300 characters, 900 bytes
    store.upsert_documents(
        "c",
        [_document("hex", f"dump {hexdump} end"), _document("cjk", f"{cjk} sentence")],
        new_collection=NewCollection("m", 4),
    )
    assert store.document_ids("c") == ["hex", "cjk"]
    terms = store.term_document_counts("c")
    assert "dump" in terms and "sentenc" in terms
    assert all(len(t.encode()) <= store_module.MAX_TERM_BYTES for t in terms)
    assert store.keyword_search("c", KeywordQuery({hexdump: 1}), 5) == []
    assert [hit.chunk_id for hit in store.keyword_search("c", KeywordQuery({"dump": 1}), 5)] == ["hex#0"]

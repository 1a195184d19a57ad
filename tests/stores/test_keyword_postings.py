"""The SQLite store's keyword postings in memory rank and score exactly as FTS5's flat bm25.

Large collections (store.POSTINGS_MIN_CHUNKS chunks) answer an unfiltered flat keyword search from each
chunk's postings (table chunk_terms) loaded into memory by a thread that the first search starts (FTS5
answers until then). The threshold is lowered here so that the bundled
SciFact sample takes that path; the reference is the same store's FTS5 query (both thresholds raised past
the collection). Two stores on one file stand for two processes: the reader's postings must follow the
writer's changes. The cases are test_keyword_pruning's, plus a title weight whose multiples are inexact.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iris_rag.backends.sqlite import postings as sqlite_postings
from iris_rag.backends.sqlite import store as sqlite_store
from iris_rag.backends.sqlite.postings import KeywordPostings
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.stores.base import KeywordQuery, ScoredChunk
from iris_rag.text import query_terms
from tests.stores.conftest import document, read
from tests.stores.test_keyword_pruning import queries


class Answered:
    """Counts the searches the postings answered (not handed to FTS5)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        score = KeywordPostings.score

        def counted(postings: KeywordPostings, *args: Any) -> list[tuple[str, float]] | None:
            found = score(postings, *args)
            self.count += found is not None
            return found

        monkeypatch.setattr(KeywordPostings, "score", counted)


def search(
    store: SqliteStore, query: KeywordQuery, top_k: int, monkeypatch: pytest.MonkeyPatch, *, postings: bool
) -> list[ScoredChunk]:
    monkeypatch.setattr(sqlite_store, "POSTINGS_MIN_CHUNKS", 1 if postings else sys.maxsize)
    monkeypatch.setattr(sqlite_store, "PRUNE_MIN_CHUNKS", sys.maxsize)  # FTS5's full ranking
    return store.keyword_search("c", query, top_k)


def assert_same(got: list[ScoredChunk], expected: list[ScoredChunk]) -> None:
    """The same chunks in the same order with the very same scores (the same doubles)."""
    assert [(hit.chunk_id, hit.score) for hit in got] == [(hit.chunk_id, hit.score) for hit in expected]


def all_queries() -> list[KeywordQuery]:
    made = queries()
    made += [KeywordQuery.of(list(query.terms), 1.3) for query in made[:5]]  # weight x count inexact
    made.append(KeywordQuery({"cells": 1, "": 1, "tumor": 2}))  # an empty term: no phrase
    return made


def test_postings_rankings_equal_fts5s(
    pair: tuple[SqliteStore, SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, _ = pair
    loaded(reader, monkeypatch)
    answered = Answered(monkeypatch)
    for query in all_queries():
        for top_k in (1, 10, 50, 2000):
            expected = search(reader, query, top_k, monkeypatch, postings=False)
            got = search(reader, query, top_k, monkeypatch, postings=True)
            assert_same(got, expected)
    # The postings answered all but the queries with a phrase ('covid-19', 'say "x"'): else this compares
    # FTS5 with itself.
    assert answered.count == 4 * (len(all_queries()) - 1)


@pytest.mark.parametrize("delta", ["delta", "compacted"])
def test_postings_follow_another_process_writes(
    pair: tuple[SqliteStore, SqliteStore], monkeypatch: pytest.MonkeyPatch, delta: str
) -> None:
    reader, writer = pair
    if delta == "compacted":  # every update rebuilds one index
        monkeypatch.setattr(sqlite_postings, "MIN_DELTA_POSTINGS", 0)
        monkeypatch.setattr(sqlite_postings, "DELTA_SHARE", 0.0)
    loads: list[str] = []
    load = SqliteStore._read_postings

    def counted(store: SqliteStore, collection_id: str) -> Any:
        loads.append(collection_id)
        return load(store, collection_id)

    monkeypatch.setattr(SqliteStore, "_read_postings", counted)
    corpus = read("corpus.jsonl")
    probe = [KeywordQuery.of(query_terms(q["text"])) for q in read("queries.jsonl")[:20]]
    loaded(reader, monkeypatch)
    first = {id(q): search(reader, q, 10, monkeypatch, postings=True) for q in probe}
    answered = Answered(monkeypatch)
    for round_ in range(2):  # twice: an update of an updated version
        # The best hits of some probes deleted, others rewritten with a query's words, new ones added.
        for query in probe[5 * round_ : 5 * round_ + 5]:
            for hit in search(reader, query, 2, monkeypatch, postings=True):
                writer.delete_document("c", hit.chunk_id.split("#")[0])
        writer.upsert_documents(
            "c",
            [  # the same documents each round: a document rewritten twice
                document(d["_id"], d["title"], " ".join(probe[i + 10 * round_].terms) * 3)
                for i, d in enumerate(corpus[:5])
            ]
            + [document(f"new{round_}-{i}", "", " ".join(q.terms)) for i, q in enumerate(probe[5:10])],
        )
        changed = 0
        for query in probe:
            expected = search(reader, query, 10, monkeypatch, postings=False)
            got = search(reader, query, 10, monkeypatch, postings=True)
            assert_same(got, expected)
            changed += got != first[id(query)]
        assert changed >= 10  # the writes moved the rankings the reader now returns
    assert loads == ["c"]  # loaded once, then updated from the change log
    stats = reader.stats()
    assert stats["keyword_postings_loaded"] == {"c": stats["chunks"]}
    assert int(stats["keyword_postings_memory_bytes"]) > 0
    assert answered.count >= 2 * len(probe) + 10


def wait_for_load(store: SqliteStore) -> None:
    """Until the loading thread that a search started is done."""
    deadline = time.monotonic() + 60
    while store._loading and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not store._loading


def loaded(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first search (FTS5 answers it and a thread loads the postings), then the load waited for."""
    connections = len(store._connections)
    search(store, KeywordQuery({"cells": 1}), 10, monkeypatch, postings=True)
    wait_for_load(store)
    assert len(store._connections) == connections  # the loading thread closed its own


def test_a_version_7_database_is_filled_while_fts5_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.sqlite3"
    old = SqliteStore(path)
    old.create_collection("c", "model", 4)
    old.upsert_documents("c", [document(d["_id"], d["title"], d["text"]) for d in read("corpus.jsonl")])
    old.close()
    with closing(sqlite3.connect(path)) as connection:  # as version 7 left it: no postings
        connection.executescript(
            "DROP TRIGGER chunk_terms_delete; DROP TABLE chunk_terms; DROP TABLE keyword_terms;"
            "PRAGMA user_version = 7;"
        )
    store = SqliteStore(path)
    answered = Answered(monkeypatch)
    fills: list[int] = []
    fill = SqliteStore.fill_keyword_terms
    started = threading.Event()

    def counted(self: SqliteStore, *args: Any) -> int:
        started.wait(10)  # the first search returns before any chunk is filled
        fills.append(fill(self, *args))
        return fills[-1]

    monkeypatch.setattr(SqliteStore, "fill_keyword_terms", counted)
    monkeypatch.setattr(sqlite_store, "FILL_BATCH_CHUNKS", 100)  # several transactions
    probe = [KeywordQuery.of(query_terms(q["text"])) for q in read("queries.jsonl")[:10]]
    store.get_collection("c")
    for query in probe:  # FTS5 answers while the postings are being filled
        expected = search(store, query, 10, monkeypatch, postings=False)
        assert_same(search(store, query, 10, monkeypatch, postings=True), expected)
    assert answered.count == 0
    started.set()
    wait_for_load(store)
    chunks = sqlite_store.sqlite_connection(store).execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    assert fills == [chunks]
    for query in probe:
        expected = search(store, query, 10, monkeypatch, postings=False)
        assert_same(search(store, query, 10, monkeypatch, postings=True), expected)
    assert answered.count == len(probe)
    # A chunk written by an earlier version since (no postings): FTS5 answers again and it is filled.
    store.upsert_documents("c", [document("late", "Late", " ".join(probe[0].terms))])
    sqlite_store.sqlite_connection(store).execute(
        "DELETE FROM chunk_terms WHERE chunk_rowid = (SELECT MAX(rowid) FROM chunks)"
    )
    store.upsert_documents("c", [document("later", "", "tumor cells")])  # moves the version on
    before = answered.count
    expected = search(store, probe[0], 10, monkeypatch, postings=False)
    assert_same(search(store, probe[0], 10, monkeypatch, postings=True), expected)
    assert answered.count == before
    wait_for_load(store)
    assert fills[-1] == 1
    assert_same(search(store, probe[0], 10, monkeypatch, postings=True), expected)
    assert answered.count == before + 1
    store.close()


def test_deleted_chunks_take_their_postings(pair: tuple[SqliteStore, SqliteStore]) -> None:
    _, writer = pair
    connection = sqlite_store.sqlite_connection(writer)
    writer.delete_document("c", read("corpus.jsonl")[0]["_id"])
    writer.delete_collection("c")
    assert connection.execute("SELECT COUNT(*) FROM chunk_terms").fetchone()[0] == 0


@pytest.mark.parametrize("title_weight", [1.0, 2.5, 0.5, 1.3, 0.7, 2.2, 0.1, 3.7])
def test_weighted_counts_add_as_fts5_adds(title_weight: float) -> None:
    """The title weight once per title instance, then 1.0 per content one, in doubles as FTS5 sums them."""
    rng = np.random.default_rng(7)
    title = rng.integers(0, 9, 500).astype(np.uint16)
    content = rng.integers(0, 40, 500).astype(np.uint16)
    expected = []
    for t, c in zip(title.tolist(), content.tolist(), strict=True):
        frequency = 0.0
        for _ in range(t):
            frequency += title_weight
        for _ in range(c):
            frequency += 1.0
        expected.append(frequency)
    assert sqlite_postings._weighted_counts(title, content, title_weight).tolist() == expected

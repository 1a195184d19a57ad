"""The SQLite store's pruned flat keyword search (MaxScore over FTS5) ranks exactly as FTS5's full ranking.

Large collections (store.PRUNE_MIN_CHUNKS chunks) score only the rows of their rarest query terms when the
rest cannot reach the top k. The threshold is lowered here so that the bundled SciFact sample takes that
path; the reference is the same store's unpruned query (the threshold raised past the collection). Two
stores on one file stand for two processes: the reader must stay exact after the writer's changes.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from iris_rag.backends.sqlite import store as sqlite_store
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.stores.base import KeywordQuery, ScoredChunk
from iris_rag.text import query_terms
from tests.stores.conftest import document, read


def queries() -> list[KeywordQuery]:
    """The sample's queries as hybrid's keyword leg makes them, plus weights, a title weight and phrases."""
    made = [KeywordQuery.of(query_terms(q["text"])) for q in read("queries.jsonl")]
    made += [KeywordQuery.of(list(query.terms), 2.5) for query in made[:10]]
    made.append(KeywordQuery({"cells": 2, "the": 3, "of": 1, "tumor": 1, "covid-19": 1, 'say "x"': 1}))
    made.append(KeywordQuery({"the": 1, "of": 1, "and": 1}))  # only frequent terms
    made.append(KeywordQuery({"zzzqqq": 1, "the": 1}))  # a term no row holds
    return made


def search(
    store: SqliteStore, query: KeywordQuery, top_k: int, monkeypatch: pytest.MonkeyPatch, *, pruned: bool
) -> list[ScoredChunk]:
    monkeypatch.setattr(sqlite_store, "PRUNE_MIN_CHUNKS", 1 if pruned else sys.maxsize)
    return store.keyword_search("c", query, top_k)


def assert_same(got: list[ScoredChunk], expected: list[ScoredChunk]) -> None:
    assert [hit.chunk_id for hit in got] == [hit.chunk_id for hit in expected]
    assert [hit.score for hit in got] == pytest.approx([hit.score for hit in expected], rel=1e-12)


def test_pruned_rankings_equal_fts5s(
    pair: tuple[SqliteStore, SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, _ = pair
    monkeypatch.setattr(sqlite_store, "PRUNE_ESSENTIAL_SHARE", 0.02)  # about 20 of the ~900 rows
    rounds: list[int] = []
    essential = SqliteStore._rank_essential

    def counted(self: SqliteStore, *args: Any) -> list[tuple[int, float]]:
        rounds.append(1)
        return essential(self, *args)

    monkeypatch.setattr(SqliteStore, "_rank_essential", counted)
    pruned_only = 0
    for query in queries():
        for top_k in (1, 10, 50):
            expected = search(reader, query, top_k, monkeypatch, pruned=False)
            before = len(rounds)
            got = search(reader, query, top_k, monkeypatch, pruned=True)
            assert_same(got, expected)
            pruned_only += len(rounds) > before
    # The pruned rounds ran (else this compares FTS5 with itself): on most queries at top 10 and 1.
    assert pruned_only > len(queries())


def test_pruned_rankings_follow_another_process_writes(
    pair: tuple[SqliteStore, SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, writer = pair
    corpus = read("corpus.jsonl")
    probe = [KeywordQuery.of(query_terms(q["text"])) for q in read("queries.jsonl")[:20]]
    first = {id(q): search(reader, q, 10, monkeypatch, pruned=True) for q in probe}
    # The best hits of every probe deleted, others rewritten with a query's words, new ones added.
    for query in probe[:5]:
        for hit in first[id(query)][:2]:
            writer.delete_document("c", hit.chunk_id.split("#")[0])
    writer.upsert_documents(
        "c",
        [document(d["_id"], d["title"], " ".join(probe[i].terms) * 3) for i, d in enumerate(corpus[:5])]
        + [document(f"new{i}", "", " ".join(q.terms)) for i, q in enumerate(probe[5:10])],
    )
    changed = 0
    for query in probe:
        expected = search(reader, query, 10, monkeypatch, pruned=False)
        got = search(reader, query, 10, monkeypatch, pruned=True)
        assert_same(got, expected)
        changed += got != first[id(query)]
    assert changed >= 10  # the writes moved the rankings the reader now returns

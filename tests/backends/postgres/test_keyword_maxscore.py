"""The Postgres keyword leg ranked by MaxScore (frequent terms' postings skipped) equals the full ranking."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest

from iris_rag.backends.common.bm25 import query_stems
from iris_rag.backends.postgres import keyword_blocks
from iris_rag.backends.postgres import store as store_module
from iris_rag.backends.postgres.store import PostgresStore
from iris_rag.stores.base import KeywordQuery, ScoredChunk
from iris_rag.stores.filters import parse_filters
from tests.backends.postgres.blocks import posting_rows, undo_packing
from tests.backends.postgres.test_bulk import NEW, _documents


@pytest.fixture
def store(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresStore]:
    # Blocks of 4 postings: many blocks per term (appends, deletes and lookups cross their edges), and
    # a lookup reads about the postings it needs.
    monkeypatch.setattr(keyword_blocks, "BLOCK_POSTINGS", 4)
    opened = PostgresStore(postgres_url)
    with opened.bulk_load():
        opened.upsert_documents("c", _documents(300), new_collection=NEW)
    yield opened
    opened.close()


def _term_rows(store: PostgresStore, collection_id: str) -> tuple[list[Any], list[Any]]:
    """keyword_terms' rows, and the same counted from the postings."""
    connection = store.connection()
    kept = connection.execute(
        "SELECT term, chunks, title_chunks, content_chunks FROM keyword_terms "
        "WHERE collection_id = %s ORDER BY term",
        (collection_id,),
    ).fetchall()
    counts: dict[str, list[int]] = {}
    for term, _, title_tf, content_tf, _, _ in posting_rows(connection, collection_id):
        counted = counts.setdefault(term, [0, 0, 0])
        counted[0] += 1
        counted[1] += int(title_tf > 0)
        counted[2] += int(content_tf > 0)
    return kept, [
        {"term": term, "chunks": c[0], "title_chunks": c[1], "content_chunks": c[2]}
        for term, c in sorted(counts.items())
    ]


def test_term_counts_stay_in_step_with_the_postings(store: PostgresStore, postgres_url: str) -> None:
    kept, counted = _term_rows(store, "c")
    assert kept == counted and len(kept) > 1000
    changed = _documents(40, seed=9, suffix=" Zebrafish aplenty.")
    store.upsert_documents("c", changed[:30])  # replacements, row by row
    store.upsert_documents("c", _documents(300)[100:], new_collection=NEW)  # replacements, by COPY
    for document in changed[30:]:
        store.delete_document("c", document.id)
    kept, counted = _term_rows(store, "c")
    assert kept == counted
    assert {"zebrafish", "aplenti"} <= {row["term"] for row in kept}
    assert store.term_document_counts("c") == {row["term"]: row["chunks"] for row in counted}
    # A database from before migration 11 gets the counts from its postings (then packs them: 13).
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        undo_packing(connection)
        connection.execute("DROP TABLE keyword_terms")
        connection.execute("DELETE FROM schema_migrations WHERE version = 11")
    upgraded = PostgresStore(postgres_url)
    try:
        assert _term_rows(upgraded, "c") == (counted, counted)
    finally:
        upgraded.close()
    store.delete_collection("c")
    assert _term_rows(store, "c") == ([], [])


def _ranked(hits: list[ScoredChunk]) -> list[tuple[str, float]]:
    return [(hit.chunk_id, round(hit.score, 9)) for hit in hits]


@pytest.mark.parametrize("lookup_cost", [0, store_module.BLOCK_LOOKUP_COST])
def test_max_score_ranks_exactly_as_every_posting_does(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, lookup_cost: int
) -> None:
    """With lookups at no cost, the frequent terms are looked up whenever the bound allows."""
    monkeypatch.setattr(store_module, "BLOCK_LOOKUP_COST", lookup_cost)
    counts = store.term_document_counts("c")
    by_frequency = sorted(counts, key=lambda term: (-counts[term], term))
    frequent, middling, rare = by_frequency[:15], by_frequency[15:200], by_frequency[200:]
    assert counts[frequent[0]] > 400 and counts[rare[-1]] == 1
    rng = np.random.default_rng(11)
    queries: list[dict[str, int]] = [{frequent[0]: 1, frequent[1]: 1}, {rare[0]: 1}]
    for _ in range(60):
        picked = [
            *rng.choice(frequent, int(rng.integers(1, 4)), replace=False),
            *rng.choice(middling, int(rng.integers(0, 3)), replace=False),
            *rng.choice(rare, int(rng.integers(0, 3)), replace=False),
        ]
        queries.append({str(term): int(rng.integers(1, 3)) for term in picked})
    scored: list[int] = []
    postings = keyword_blocks.postings_of

    def counting(rows: list[tuple[Any, ...]], index: dict[str, int]) -> Any:
        found = postings(rows, index)
        scored.append(len(found.chunk_row))
        return found

    monkeypatch.setattr(keyword_blocks, "postings_of", counting)
    skipped = 0
    even = parse_filters({"even": True})
    for number, terms in enumerate(queries):
        scoring = ("flat", "multifield")[number % 2]
        query = KeywordQuery(terms, (1.0, 2.0, 0.5)[number % 3], scoring)  # type: ignore[arg-type]
        for top_k, metadata_filter in ((1, None), (10, None), (50, None), (10, even), (5000, None)):
            monkeypatch.setattr(store_module, "PRUNE_MIN_POSTINGS", 10**12)
            expected = store.keyword_search("c", query, top_k, metadata_filter)
            monkeypatch.setattr(store_module, "PRUNE_MIN_POSTINGS", 0)
            scored.clear()
            got = store.keyword_search("c", query, top_k, metadata_filter)
            assert [h.chunk_id for h in got] == [h.chunk_id for h in expected], (terms, top_k)
            assert [h.score for h in got] == pytest.approx([h.score for h in expected], rel=1e-12)
            total = sum(counts.get(term, 0) for term in query_stems(terms))
            skipped += int(max(scored) < total)
    # The point of it: most of these queries scored fewer postings than their terms have.
    assert skipped > len(queries) * (2 if lookup_cost == 0 else 0.5)

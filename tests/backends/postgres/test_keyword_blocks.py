"""The PostgreSQL keyword postings packed in blocks stay exactly the postings of the live chunks.

Blocks of 4 postings here (BLOCK_POSTINGS is 64 in use), so every kind of write crosses block edges:
row-path appends, bulk-path packing, replacements, deletes emptying blocks and an append below a term's
last row (repacked).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from iris_rag.backends.common.bm25 import term_frequencies
from iris_rag.backends.postgres import keyword_blocks
from iris_rag.backends.postgres.store import PostgresStore
from tests.backends.postgres.blocks import block_layout, posting_rows
from tests.backends.postgres.test_bulk import NEW, _documents

BLOCK = 4


@pytest.fixture
def store(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresStore]:
    monkeypatch.setattr(keyword_blocks, "BLOCK_POSTINGS", BLOCK)
    opened = PostgresStore(postgres_url)
    yield opened
    opened.close()


def _expected(store: PostgresStore, collection_id: str) -> list[tuple[str, int, int, int, int, int]]:
    """The postings of the collection's live chunks, tokenized from their stored text."""
    chunks = (
        store.connection()
        .execute(
            "SELECT k.row_id, k.content, d.title FROM chunks k JOIN documents d "
            "ON d.collection_id = k.collection_id AND d.id = k.document_id WHERE k.collection_id = %s",
            (collection_id,),
        )
        .fetchall()
    )
    expected = []
    for chunk in chunks:
        (title_terms, title_length), (content_terms, content_length) = term_frequencies(
            [chunk["title"], chunk["content"]]
        )
        for term in title_terms.keys() | content_terms.keys():
            expected.append(
                (term, chunk["row_id"], title_terms[term], content_terms[term], title_length, content_length)
            )
    return sorted(expected)


def _check(store: PostgresStore, collection_id: str) -> None:
    connection = store.connection()
    assert posting_rows(connection, collection_id) == _expected(store, collection_id)
    for term, blocks in block_layout(connection, collection_id).items():
        starts = [first for first, _ in blocks]
        ends = [*starts[1:], None]
        for (first, rows), end in zip(blocks, ends, strict=True):
            assert 0 < len(rows) <= BLOCK, term
            assert rows == sorted(rows) and rows[0] >= first, term
            assert end is None or rows[-1] < end, (term, "blocks overlap")


def test_every_write_keeps_the_blocks_exact(store: PostgresStore) -> None:
    documents = _documents(120)
    store.upsert_documents("c", documents[:20], new_collection=NEW)  # row path, block by block
    _check(store, "c")
    store.upsert_documents("c", documents[20:100])  # 160 chunks, under the bulk threshold: rows
    with store.bulk_load():  # staged, packed at the end; a replacement and a delete inside
        store.upsert_documents("c", documents[100:120])
        store.upsert_documents("c", _documents(5, seed=3, suffix=" Zebrafish again."))
        store.delete_document("c", documents[110].id)
        store.upsert_documents("c", documents[115:118])  # replaced again in the same load
    _check(store, "c")
    assert {"zebrafish"} <= {term for term, *_ in posting_rows(store.connection(), "c")}
    for document in documents[30:60:3]:  # deletes: blocks emptied and thinned
        assert store.delete_document("c", document.id)
    store.upsert_documents("c", documents[40:50])  # re-added at the end
    _check(store, "c")


def test_an_append_below_a_terms_last_row_repacks_the_term(store: PostgresStore) -> None:
    store.upsert_documents("c", _documents(40), new_collection=NEW)
    connection = store.connection()
    before = posting_rows(connection, "c")
    term = "cell"
    held = [p for p in before if p[0] == term]
    assert len(held) > 3 * BLOCK
    early = held[2]  # taken out, then appended again below the term's last row
    with store.transaction() as connection:
        keyword_blocks.remove_postings(connection, "c", [(term, early[1])])
        assert posting_rows(connection, "c") == [p for p in before if p != early]
        keyword_blocks.append_postings(connection, "c", [("c", *early)])
    _check(store, "c")

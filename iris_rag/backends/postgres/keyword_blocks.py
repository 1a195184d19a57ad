"""The BM25 postings on PostgreSQL, packed per term in blocks of up to BLOCK_POSTINGS chunks.

A row of keyword_blocks holds one term's postings for a run of chunk rows: the chunk rows (int8), the
term's count in the title and in the content, and the chunk's two field lengths (int4 each), every
column one big-endian bytea in chunk-row order. A row per (term, chunk) cost about 190 bytes on disk
with its indexes (13.6 KB a chunk) and a microsecond and more to read; a block costs about 24 bytes a
posting and is read as five byte strings. A term's blocks cover disjoint ranges of chunk rows, each
starting at `first_row`: the posting of chunk row r is in the block with the largest first_row <= r.

Writes keep that: new chunks take rows from the sequence (greater than every row of their collection,
whose writers take turns on its totals row), so the row path appends to each term's last block; the
bulk path stages its postings in a temporary table and packs them in one statement at the end of the
transaction (PACK_SQL, the same statement migration 13 packed the old rows with); a deleted chunk's
postings are taken out of the blocks holding them (found again from its text, as FTS5 does).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg import Connection
from psycopg.rows import tuple_row

from iris_rag.backends.common.bm25 import Postings

logger = logging.getLogger(__name__)

# Postings per block: 64 keep a full row (about 1.5 KB) under PostgreSQL's 2 KB TOAST threshold, so a
# block is read from the table's own page, uncompressed.
BLOCK_POSTINGS = 64

# (collection_id, term, chunk_row, title_tf, content_tf, title_length, content_length)
Posting = tuple[str, str, int, int, int, int, int]
# (term, first_row, the five packed columns)
Block = tuple[str, int, list[bytes]]

_TYPES = (">i8", ">i4", ">i4", ">i4", ">i4")

# Packs a table of one row per posting (columns as keyword_staging's) into blocks: each term's postings
# in chunk-row order, cut every {block} (BLOCK_POSTINGS).
PACK_SQL = """
INSERT INTO keyword_blocks
SELECT collection_id, term, MIN(chunk_row),
       string_agg(int8send(chunk_row), ''::bytea ORDER BY chunk_row),
       string_agg(int4send(title_tf), ''::bytea ORDER BY chunk_row),
       string_agg(int4send(content_tf), ''::bytea ORDER BY chunk_row),
       string_agg(int4send(title_length), ''::bytea ORDER BY chunk_row),
       string_agg(int4send(content_length), ''::bytea ORDER BY chunk_row)
FROM (SELECT *, (row_number() OVER (PARTITION BY collection_id, term ORDER BY chunk_row) - 1)
                / {block} AS block
      FROM {source}) AS numbered
GROUP BY collection_id, term, block"""

CREATE_TABLE_SQL = """
CREATE TABLE keyword_blocks (
    collection_id  TEXT NOT NULL,
    term           TEXT NOT NULL,
    first_row      BIGINT NOT NULL,
    chunk_rows     BYTEA NOT NULL,
    title_tf       BYTEA NOT NULL,
    content_tf     BYTEA NOT NULL,
    title_length   BYTEA NOT NULL,
    content_length BYTEA NOT NULL,
    PRIMARY KEY (collection_id, term, first_row)
)"""

# Each term's blocks joined, one bytea per column in chunk-row order: what postings_of() decodes.
_JOINED = """term, string_agg(chunk_rows, ''::bytea ORDER BY first_row),
       string_agg(title_tf, ''::bytea ORDER BY first_row),
       string_agg(content_tf, ''::bytea ORDER BY first_row),
       string_agg(title_length, ''::bytea ORDER BY first_row),
       string_agg(content_length, ''::bytea ORDER BY first_row)"""
# A query's postings: one row per term.
POSTINGS_SQL = (
    f"SELECT {_JOINED} FROM keyword_blocks WHERE collection_id = %s AND term = ANY(%s) GROUP BY term"
)
# Where each of some terms' blocks starts (the primary key alone): one row per term, first rows packed.
BLOCK_STARTS_SQL = """
SELECT term, string_agg(int8send(first_row), ''::bytea ORDER BY first_row)
FROM keyword_blocks WHERE collection_id = %s AND term = ANY(%s) GROUP BY term"""
# Given blocks (term, first_row) of a collection, as POSTINGS_SQL returns them.
BLOCKS_SQL = f"""
SELECT {_JOINED} FROM keyword_blocks
JOIN unnest(%s::text[], %s::bigint[]) AS w(wanted_term, wanted_row)
    ON term = wanted_term AND first_row = wanted_row
WHERE collection_id = %s GROUP BY term"""

_STAGING_SQL = """
CREATE TEMPORARY TABLE IF NOT EXISTS keyword_staging (
    collection_id TEXT, term TEXT, chunk_row BIGINT, title_tf INTEGER, content_tf INTEGER,
    title_length INTEGER, content_length INTEGER
) ON COMMIT DELETE ROWS"""
# The block holding each (term, chunk row) pair.
_HOLDING_SQL = """
SELECT b.term, b.first_row, b.chunk_rows, b.title_tf, b.content_tf, b.title_length, b.content_length
FROM unnest(%s::text[], %s::bigint[]) AS w(term, chunk_row)
CROSS JOIN LATERAL (SELECT * FROM keyword_blocks x WHERE x.collection_id = %s AND x.term = w.term
                    AND x.first_row <= w.chunk_row ORDER BY x.first_row DESC LIMIT 1) AS b"""
# Each term's last block: its first row, how many postings it holds and its last chunk row (8 bytes).
_LAST_SQL = """
SELECT b.term, b.first_row, octet_length(b.chunk_rows) / 8,
       substring(b.chunk_rows FROM octet_length(b.chunk_rows) - 7)
FROM unnest(%s::text[]) AS w(term)
CROSS JOIN LATERAL (SELECT * FROM keyword_blocks x WHERE x.collection_id = %s AND x.term = w.term
                    ORDER BY x.first_row DESC LIMIT 1) AS b"""
# Blocks written, extended, rewritten and deleted many at a time (one statement each, a row per block).
_BLOCKS = """unnest(%s::text[], %s::bigint[], %s::bytea[], %s::bytea[], %s::bytea[], %s::bytea[], %s::bytea[])
    AS u(term, first_row, chunk_rows, title_tf, content_tf, title_length, content_length)"""
_INSERT_SQL = f"INSERT INTO keyword_blocks SELECT %s, * FROM {_BLOCKS}"
_EXTEND_SQL = f"""UPDATE keyword_blocks b SET chunk_rows = b.chunk_rows || u.chunk_rows,
    title_tf = b.title_tf || u.title_tf, content_tf = b.content_tf || u.content_tf,
    title_length = b.title_length || u.title_length, content_length = b.content_length || u.content_length
FROM {_BLOCKS} WHERE b.collection_id = %s AND b.term = u.term AND b.first_row = u.first_row"""
_REWRITE_SQL = f"""UPDATE keyword_blocks b SET chunk_rows = u.chunk_rows, title_tf = u.title_tf,
    content_tf = u.content_tf, title_length = u.title_length, content_length = u.content_length
FROM {_BLOCKS} WHERE b.collection_id = %s AND b.term = u.term AND b.first_row = u.first_row"""
_DELETE_SQL = """DELETE FROM keyword_blocks b USING unnest(%s::text[], %s::bigint[]) AS u(term, first_row)
WHERE b.collection_id = %s AND b.term = u.term AND b.first_row = u.first_row"""


def postings_of(rows: list[tuple[Any, ...]], index: dict[str, int]) -> Postings:
    """POSTINGS_SQL's or BLOCKS_SQL's rows (a term each, its columns joined) as arrays; terms by `index`.

    In the query's term order, whatever order the rows came in: each chunk's score then adds its terms
    in one order (the float sum, and so the order of near ties, does not depend on the plan or on which
    terms MaxScore read first).
    """
    rows = sorted(rows, key=lambda row: index[row[0]])
    chunk_row, title_tf, content_tf, title_length, content_length = (
        np.frombuffer(b"".join(row[1 + i] for row in rows), dtype=kind) for i, kind in enumerate(_TYPES)
    )
    return Postings(
        term=np.concatenate(
            [np.full(len(row[1]) // 8, index[row[0]], dtype=np.int64) for row in rows]
            or [np.zeros(0, dtype=np.int64)]
        ),
        chunk_row=chunk_row.astype(np.int64),
        title_tf=title_tf.astype(np.float64),
        content_tf=content_tf.astype(np.float64),
        title_length=title_length.astype(np.float64),
        content_length=content_length.astype(np.float64),
    )


def _decode(row: tuple[Any, ...]) -> npt.NDArray[np.int64]:
    """A block's columns (after term and first_row) as rows of (chunk_row, title_tf, ... content_length)."""
    return np.stack(
        [np.frombuffer(bytes(row[2 + i]), dtype=kind).astype(np.int64) for i, kind in enumerate(_TYPES)],
        axis=1,
    )


def _encode(postings: npt.NDArray[np.int64]) -> list[bytes]:
    """The five packed columns of postings given as rows (chunk_row, title_tf, ... content_length)."""
    return [postings[:, i].astype(kind).tobytes() for i, kind in enumerate(_TYPES)]


def _as_array(postings: list[Posting]) -> npt.NDArray[np.int64]:
    return np.asarray([posting[2:] for posting in postings], dtype=np.int64).reshape(-1, 5)


def _columns(blocks: Sequence[Block]) -> list[list[Any]]:
    """Blocks given as (term, first_row, packed columns) as the seven arrays _BLOCKS unnests."""
    return [
        [term for term, _, _ in blocks],
        [first_row for _, first_row, _ in blocks],
        *([packed[i] for _, _, packed in blocks] for i in range(len(_TYPES))),
    ]


def _write(
    cursor: Any,
    collection_id: str,
    *,
    inserts: Sequence[Block] = (),
    extends: Sequence[Block] = (),
    rewrites: Sequence[Block] = (),
    deletes: Sequence[tuple[str, int]] = (),
) -> None:
    """Blocks deleted, rewritten, extended (their columns appended to) and inserted: a statement each."""
    if deletes:
        cursor.execute(
            _DELETE_SQL, ([term for term, _ in deletes], [first for _, first in deletes], collection_id)
        )
    if rewrites:
        cursor.execute(_REWRITE_SQL, (*_columns(rewrites), collection_id))
    if extends:
        cursor.execute(_EXTEND_SQL, (*_columns(extends), collection_id))
    if inserts:
        cursor.execute(_INSERT_SQL, (collection_id, *_columns(inserts)))


def _cut(term: str, postings: npt.NDArray[np.int64]) -> list[Block]:
    """Postings (sorted by chunk row) as new blocks of BLOCK_POSTINGS."""
    return [
        (term, int(postings[start, 0]), _encode(postings[start : start + BLOCK_POSTINGS]))
        for start in range(0, len(postings), BLOCK_POSTINGS)
    ]


def append_postings(connection: Connection[Any], collection_id: str, postings: list[Posting]) -> None:
    """Add new chunks' postings: onto each term's last block while it has room, then as new blocks.

    A chunk row below its term's last one (not from this store's writers) has that term repacked whole.
    """
    if not postings:
        return
    by_term: dict[str, list[Posting]] = defaultdict(list)
    for posting in postings:
        by_term[posting[1]].append(posting)
    terms = sorted(by_term)
    with connection.cursor(row_factory=tuple_row) as cursor:
        last = {row[0]: row for row in cursor.execute(_LAST_SQL, (terms, collection_id)).fetchall()}
        extends: list[Block] = []
        inserts: list[Block] = []
        for term in terms:
            new = _as_array(by_term[term])
            new = new[np.argsort(new[:, 0], kind="stable")]
            held = last.get(term)
            if held is not None:
                _, first_row, count, last_row = held
                if new[0, 0] <= int(np.frombuffer(bytes(last_row), dtype=">i8")[0]):
                    _repack_term(cursor, collection_id, term, new)  # out of order
                    continue
                room = max(0, BLOCK_POSTINGS - int(count))
                if room:
                    extends.append((term, int(first_row), _encode(new[:room])))
                    new = new[room:]
            inserts.extend(_cut(term, new))
        _write(cursor, collection_id, extends=extends, inserts=inserts)


def _repack_term(cursor: Any, collection_id: str, term: str, new: npt.NDArray[np.int64]) -> None:
    """One term's blocks rebuilt with the given postings added (rows in any order)."""
    rows = cursor.execute(
        "DELETE FROM keyword_blocks WHERE collection_id = %s AND term = %s "
        "RETURNING term, first_row, chunk_rows, title_tf, content_tf, title_length, content_length",
        (collection_id, term),
    ).fetchall()
    every = np.concatenate([*(_decode(row) for row in rows), new])
    _write(cursor, collection_id, inserts=_cut(term, every[np.argsort(every[:, 0], kind="stable")]))


def remove_postings(connection: Connection[Any], collection_id: str, pairs: list[tuple[str, int]]) -> None:
    """Take the (term, chunk row) postings out of their blocks; a block left empty goes."""
    if not pairs:
        return
    gone: dict[str, set[int]] = defaultdict(set)
    for term, row in pairs:
        gone[term].add(row)
    with connection.cursor(row_factory=tuple_row) as cursor:
        held = cursor.execute(
            _HOLDING_SQL, ([term for term, _ in pairs], [row for _, row in pairs], collection_id)
        ).fetchall()
        blocks = {(row[0], row[1]): row for row in held}  # a block holding several of them, once
        rewrites: list[Block] = []
        deletes: list[tuple[str, int]] = []
        for (term, first_row), block in sorted(blocks.items()):
            postings = _decode(block)
            kept = postings[~np.isin(postings[:, 0], list(gone[term]))]
            if len(kept) == len(postings):
                continue
            if len(kept):
                rewrites.append((term, first_row, _encode(kept)))
            else:
                deletes.append((term, first_row))
        _write(cursor, collection_id, rewrites=rewrites, deletes=deletes)


def stage_postings(connection: Connection[Any], postings: list[Posting]) -> None:
    """The bulk path: postings copied into this session's staging table, packed by pack_staged()."""
    connection.execute(_STAGING_SQL)
    with (
        connection.cursor() as cursor,
        cursor.copy("COPY keyword_staging FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(["text", "text", "int8", "int4", "int4", "int4", "int4"])
        for posting in postings:
            copy.write_row(posting)


def pack_staged(connection: Connection[Any]) -> None:
    """The staged postings packed into blocks after every block of their terms (their rows are newer)."""
    start = time.perf_counter()
    blocks = connection.execute(PACK_SQL.format(source="keyword_staging", block=BLOCK_POSTINGS)).rowcount
    postings = connection.execute("DELETE FROM keyword_staging").rowcount
    logger.info(
        "packed %d keyword postings into %d blocks in %.1f s", postings, blocks, time.perf_counter() - start
    )


def delete_collection(connection: Connection[Any], collection_id: str) -> None:
    """Every block of the collection."""
    connection.execute("DELETE FROM keyword_blocks WHERE collection_id = %s", (collection_id,))

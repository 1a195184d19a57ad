"""Terms exactly as SQLite FTS5's `porter unicode61` tokenizer indexes them, and BM25 from postings.

The Postgres and IRIS keyword indexes store these terms per chunk, so their BM25 (computed here in NumPy
from the collection's own counts) matches the SQLite store's FTS5 bm25 (k1 1.2, b 0.75). The tokenizer is
FTS5's own, run on an in-memory SQLite table: a re-implementation (unicode61 rules, snowballstemmer's porter)
differed on about 0.4% of SciFact's words (FTS5's porter maps 'logi' -> 'log' and 'bli' -> 'ble'; unicode61
folds the micro sign to Greek mu).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from iris_rag.stores.base import BM25_B, BM25_IDF_FLOOR, BM25_K1, MULTIFIELD_OTHER_SHARE

# Chunk scores are summed over the row range (a bincount) when it spans under this many rows a posting.
DENSE_SPAN_PER_POSTING = 4

_local = threading.local()


def _tokenizer() -> sqlite3.Connection:
    connection: sqlite3.Connection | None = getattr(_local, "connection", None)
    if connection is None:
        connection = sqlite3.connect(":memory:", isolation_level=None)
        connection.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize = 'porter unicode61')")
        connection.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        _local.connection = connection
    return connection


def tokenize(texts: list[str]) -> list[list[str]]:
    """Each text's stemmed tokens, in order, as FTS5 `porter unicode61` indexes them."""
    if not texts:
        return []
    connection = _tokenizer()
    found: list[list[tuple[int, str]]] = [[] for _ in texts]
    connection.execute("BEGIN")
    try:
        connection.executemany("INSERT INTO t (rowid, x) VALUES (?, ?)", enumerate(texts))
        for term, row, offset in connection.execute("SELECT term, doc, offset FROM v"):
            found[row].append((offset, term))
    finally:
        connection.execute("ROLLBACK")
    return [[term for _, term in sorted(tokens)] for tokens in found]


def token_counts(texts: list[str]) -> list[Counter[str]]:
    """Each text's stemmed tokens with their counts, as FTS5 `porter unicode61` indexes them.

    tokenize() without the order: the in-memory index's instances counted as they come, no sort (the
    SQLite store writes each chunk's counts with its keyword rows, and fills them for older collections).
    """
    found: list[Counter[str]] = [Counter() for _ in texts]
    if not texts:
        return found
    connection = _tokenizer()
    connection.execute("BEGIN")
    try:
        connection.executemany("INSERT INTO t (rowid, x) VALUES (?, ?)", enumerate(texts))
        for term, row in connection.execute("SELECT term, doc FROM v"):
            found[row][term] += 1
    finally:
        connection.execute("ROLLBACK")
    return found


def tokens(text: str) -> list[str]:
    """The stemmed tokens of one text, in order."""
    return tokenize([text])[0]


def term_frequencies(texts: list[str]) -> list[tuple[Counter[str], int]]:
    """Each text's stemmed terms with their counts, and its length in tokens."""
    return [(Counter(found), len(found)) for found in tokenize(texts)]


def query_stems(terms: dict[str, int]) -> dict[str, int]:
    """Query terms (with weights) as indexed stems with weights; a stem reached twice counts twice.

    A term that tokenizes to several tokens adds each of them (FTS5 would require them adjacent: rare
    for terms cut from a query at word boundaries).
    """
    weights: Counter[str] = Counter()
    for weight, found in zip(terms.values(), tokenize(list(terms)), strict=True):
        for token in found:
            weights[token] += weight
    return dict(weights)


@dataclass(frozen=True, slots=True)
class Postings:
    """A query's postings, one entry per (term, chunk), as parallel arrays."""

    term: npt.NDArray[np.int64]  # index into the query's stems
    chunk_row: npt.NDArray[np.int64]
    title_tf: npt.NDArray[np.float64]
    content_tf: npt.NDArray[np.float64]
    title_length: npt.NDArray[np.float64]
    content_length: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Totals:
    """The collection's counts behind IDF and the average field lengths."""

    chunks: int
    titled_chunks: int
    title_tokens: int
    content_tokens: int


def _idf(rows: int, hits: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """FTS5's IDF: ln((N - n + 0.5) / (n + 0.5)), at least BM25_IDF_FLOOR."""
    return np.maximum(np.log((rows - hits + 0.5) / (hits + 0.5)), BM25_IDF_FLOOR)


def _bm25(
    tf: npt.NDArray[np.float64],
    length: npt.NDArray[np.float64],
    average_length: float,
    idf: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Each posting's BM25 term (k1 1.2, b 0.75), as FTS5's bm25 computes it; 0 where tf is 0."""
    norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average_length) if average_length > 0 else BM25_K1
    return np.where(tf > 0, idf * (tf * (BM25_K1 + 1)) / (tf + norm), 0.0)


def _per_chunk(
    chunk_row: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]]:
    """The distinct chunk rows (ascending), and a sum of per-posting values per chunk in that order.

    Each chunk's values are added in posting order either way. Where the rows are dense (a large query
    over a collection written in one run), a bincount over the row range replaces np.unique's sort: a
    third of the scoring time of a query with a million postings.
    """
    if len(chunk_row) < 2 or bool(np.all(chunk_row[1:] > chunk_row[:-1])):  # one term's: already distinct

        def identity(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            return values.astype(np.float64)

        return chunk_row, identity
    if int(chunk_row.max() - chunk_row.min()) < DENSE_SPAN_PER_POSTING * len(chunk_row):
        low = int(chunk_row.min())
        offset = chunk_row - low
        span = int(offset.max()) + 1
        present = np.bincount(offset, minlength=span) > 0

        def dense(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            return np.bincount(offset, weights=values, minlength=span)[present].astype(np.float64)

        return np.flatnonzero(present).astype(np.int64) + low, dense
    rows, chunk_of = np.unique(chunk_row, return_inverse=True)

    def sparse(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.bincount(chunk_of, weights=values, minlength=len(rows)).astype(np.float64)

    return rows, sparse


def bm25_scores(
    postings: Postings,
    weights: npt.NDArray[np.float64],
    totals: Totals,
    scoring: str,
    title_weight: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Each matching chunk's BM25 score: (chunk rows in ascending order, scores).

    Document frequencies come from the postings themselves (every posting of the query's terms in the
    collection), so IDF is over the whole collection. flat: one BM25 over title and content, tf =
    title_weight x title count + content count, length = both fields' tokens. multifield: each field's
    own BM25 (own IDF over the chunks having the field, own average length), t = title_weight x title
    score, c = content score, max(t, c) + 0.5 x min(t, c). A term of weight w counts w times.
    """
    chunk_rows, per_chunk = _per_chunk(postings.chunk_row)
    terms = len(weights)
    weight = weights[postings.term]

    def per_term_hits(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        counts = np.bincount(postings.term[mask], minlength=terms).astype(np.float64)
        return counts[postings.term]

    if scoring == "flat":
        tf = title_weight * postings.title_tf + postings.content_tf
        idf = _idf(totals.chunks, per_term_hits(np.ones(len(tf), dtype=bool)))
        average = (totals.title_tokens + totals.content_tokens) / totals.chunks if totals.chunks else 0.0
        length = postings.title_length + postings.content_length
        return chunk_rows, per_chunk(weight * _bm25(tf, length, average, idf))
    title_idf = _idf(totals.titled_chunks, per_term_hits(postings.title_tf > 0))
    content_idf = _idf(totals.chunks, per_term_hits(postings.content_tf > 0))
    title_average = totals.title_tokens / totals.titled_chunks if totals.titled_chunks else 0.0
    content_average = totals.content_tokens / totals.chunks if totals.chunks else 0.0
    title = title_weight * per_chunk(
        weight * _bm25(postings.title_tf, postings.title_length, title_average, title_idf)
    )
    content = per_chunk(
        weight * _bm25(postings.content_tf, postings.content_length, content_average, content_idf)
    )
    return chunk_rows, np.maximum(title, content) + 0.5 * np.minimum(title, content)


# Exact top-k without every posting (MaxScore): the parts of the score kept apart, IDF from stored counts,
# and each term's most a chunk can gain from it.


@dataclass(frozen=True, slots=True)
class TermCounts:
    """Each query stem's chunk counts, as a store keeps them at write time (parallel arrays by stem)."""

    chunks: npt.NDArray[np.float64]  # chunks holding the term in either field
    title_chunks: npt.NDArray[np.float64]  # ... in their document's title
    content_chunks: npt.NDArray[np.float64]  # ... in their own text


def _term_idfs(
    counts: TermCounts, totals: Totals, scoring: str
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(title IDF, content IDF) per stem; flat scoring has one IDF, returned as the content one."""
    if scoring == "flat":
        return np.zeros(len(counts.chunks)), _idf(totals.chunks, counts.chunks)
    return _idf(totals.titled_chunks, counts.title_chunks), _idf(totals.chunks, counts.content_chunks)


def bm25_parts(
    postings: Postings,
    weights: npt.NDArray[np.float64],
    totals: Totals,
    scoring: str,
    title_weight: float,
    counts: TermCounts,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Each chunk's (title part, content part) over the given postings, IDF from `counts`.

    combine_parts() of the parts over all of a query's postings is bm25_scores(); over some of its terms,
    the sums over those terms. flat: the title part is 0 and the content part is the flat score.
    """
    chunk_rows, per_chunk = _per_chunk(postings.chunk_row)
    weight = weights[postings.term]
    title_idf, content_idf = _term_idfs(counts, totals, scoring)

    if scoring == "flat":
        tf = title_weight * postings.title_tf + postings.content_tf
        average = (totals.title_tokens + totals.content_tokens) / totals.chunks if totals.chunks else 0.0
        length = postings.title_length + postings.content_length
        flat = per_chunk(weight * _bm25(tf, length, average, content_idf[postings.term]))
        return chunk_rows, np.zeros(len(chunk_rows)), flat
    title_average = totals.title_tokens / totals.titled_chunks if totals.titled_chunks else 0.0
    content_average = totals.content_tokens / totals.chunks if totals.chunks else 0.0
    title = title_weight * per_chunk(
        weight * _bm25(postings.title_tf, postings.title_length, title_average, title_idf[postings.term])
    )
    content = per_chunk(
        weight
        * _bm25(postings.content_tf, postings.content_length, content_average, content_idf[postings.term])
    )
    return chunk_rows, title, content


class PartialParts:
    """Chunks' (title part, content part) summed a term at a time, as MaxScore reads its terms.

    Held over the chunk rows' range (a term's postings add with one indexed +=) while that range stays
    within DENSE_SPAN_PER_POSTING rows a chunk of the collection (17 bytes a row); past that (a collection
    whose rows are spread among others'), as sorted arrays merged term by term.
    """

    def __init__(self, collection_chunks: int) -> None:
        self._most = DENSE_SPAN_PER_POSTING * max(collection_chunks, 1)
        self._low = 0
        self._title = np.zeros(0)
        self._content = np.zeros(0)
        self._seen = np.zeros(0, dtype=bool)  # over the range held: empty until a term adds rows
        self._sparse: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]] | None
        self._sparse = None

    def add(
        self, rows: npt.NDArray[np.int64], title: npt.NDArray[np.float64], content: npt.NDArray[np.float64]
    ) -> None:
        """One term's parts (its rows distinct) added."""
        if not len(rows):
            return
        if self._sparse is not None:
            self._merge(rows, title, content)
            return
        low, high = int(rows.min()), int(rows.max())
        if len(self._seen):
            low, high = min(low, self._low), max(high, self._low + len(self._seen) - 1)
        if high - low + 1 > self._most:
            self._merge(rows, title, content)
            return
        if low != self._low or high - low + 1 != len(self._seen):
            size, shift = high - low + 1, self._low - low
            widened = np.zeros((2, size)), np.zeros(size, dtype=bool)
            if len(self._seen):
                widened[0][0, shift : shift + len(self._seen)] = self._title
                widened[0][1, shift : shift + len(self._seen)] = self._content
                widened[1][shift : shift + len(self._seen)] = self._seen
            self._low, self._title, self._content, self._seen = low, *widened[0], widened[1]
        at = rows - low
        if title.any():  # (flat scoring's title parts are all 0)
            self._title[at] += title
        self._content[at] += content
        self._seen[at] = True

    def _merge(
        self, rows: npt.NDArray[np.int64], title: npt.NDArray[np.float64], content: npt.NDArray[np.float64]
    ) -> None:
        held = self.arrays()
        merged = np.union1d(held[0], rows)
        sums = np.zeros((2, len(merged)))
        for part_rows, part_title, part_content in (held, (rows, title, content)):
            at = np.searchsorted(merged, part_rows)
            sums[0, at] += part_title
            sums[1, at] += part_content
        self._sparse = merged, sums[0], sums[1]

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(chunk rows ascending, title parts, content parts)."""
        if self._sparse is not None:
            return self._sparse
        held = np.flatnonzero(self._seen)
        return held.astype(np.int64) + self._low, self._title[held], self._content[held]


def combine_parts(
    title: npt.NDArray[np.float64], content: npt.NDArray[np.float64], scoring: str
) -> npt.NDArray[np.float64]:
    """The score from its parts: their sum (flat), max + 0.5 x min (multifield); rising in both."""
    if scoring == "flat":
        return title + content
    return np.maximum(title, content) + MULTIFIELD_OTHER_SHARE * np.minimum(title, content)


def bm25_bounds(
    weights: npt.NDArray[np.float64], totals: Totals, scoring: str, title_weight: float, counts: TermCounts
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per stem, the most its postings add to a chunk's (title part, content part).

    A BM25 term is idf x tf (k1 + 1) / (tf + k1 (1 - b + b len / avg)), below idf x (k1 + 1) for any tf
    and length; a field no chunk has the term in adds nothing. A hair above, against rounding.
    """
    title_idf, content_idf = _term_idfs(counts, totals, scoring)
    most = weights * (BM25_K1 + 1) * (1 + 1e-9)
    if scoring == "flat":
        return np.zeros(len(weights)), most * content_idf
    title = np.where(counts.title_chunks > 0, title_weight * most * title_idf, 0.0)
    content = np.where(counts.content_chunks > 0, most * content_idf, 0.0)
    return title, content

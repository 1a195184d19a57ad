"""A large collection's keyword postings in memory: FTS5's flat bm25 ranking computed in NumPy.

FTS5's bm25() walks each query term's whole doclist for its IDF and scores every matching row, even under
ORDER BY rank LIMIT k (at 100K chunks a median of 38K rows a query, docs/benchmarks.md). Here the postings
of the collection (term -> chunk rows with the term's title and content counts) sit in memory as a
compressed sparse column index, and a query's score is computed as FTS5's fts5Bm25Function computes it:

    score = sum over the query's phrases i, in order, of
            idf_i * (f_i * (k1 + 1)) / (f_i + k1 * (1 - b + b * D / avgdl))

with f_i the phrase's weighted count in the row (the title weight once per title instance, then 1.0 per
content instance), D the row's tokens in both columns, avgdl the collection's tokens over its rows, and
idf_i = ln((N - n_i + 0.5) / (n_i + 0.5)), 1e-6 where that is not positive, n_i the rows holding the phrase.
The same operations in the same order give the same doubles (the tests compare them with FTS5's).

Only single-token phrases are answered here (every query term that FTS5 reads as one token); a term read as
several tokens (a phrase, e.g. 'covid-19') or none makes the caller ask FTS5 (`score` returns None).

The source is the `chunk_terms` table (each chunk's term ids and counts, written with its FTS5 rows, see
the store), read once; a write then makes a new version (like vectors.VectorMatrix): the changed documents'
rows marked dead, their new rows appended as a small index of their own (a delta segment). Delta segments
are merged as they accumulate, the newest two while the older is at most twice the newer, so a version holds
a few segments of geometrically growing size and a write costs the next search the merge of its own
postings (amortized over later writes), not a rebuild of every posting written since the last compaction.
When the deltas or the dead rows grow past a share of the whole, the live postings are rebuilt into one
index.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.stores.appended import Column, extended
from iris_rag.stores.base import BM25_B, BM25_IDF_FLOOR, BM25_K1

# One posting in a chunk_terms blob: (term id, title count, content count), int32 each.
POSTING_FIELDS = 3
# The deltas are merged into the main index past this many postings in all and this share of its postings.
MIN_DELTA_POSTINGS = 65_536
DELTA_SHARE = 0.125
# Dead rows that make the next version rebuild: more than this share of the rows.
DEAD_SHARE = 0.25

# Counts (title or content) of a term in chunks.
Counts = npt.NDArray[np.integer[Any]]
# A chunk's row as read with its postings: rowid, chunk id, document id, blob.
PostingRow = tuple[int, str, str, bytes]


def encode(terms: dict[int, tuple[int, int]]) -> bytes:
    """A chunk's postings blob: (term id, title count, content count) for each term, in term id order."""
    triples = np.array([(term, *counts) for term, counts in sorted(terms.items())], dtype=np.int32)
    return triples.reshape(-1).tobytes()


def _triples(blob: bytes) -> npt.NDArray[np.int32]:
    return np.frombuffer(blob, dtype=np.int32).reshape(-1, POSTING_FIELDS)


@dataclass(frozen=True, slots=True)
class _Segment:
    """Postings by term (CSC): term t's postings are [indptr[t], indptr[t + 1]), in slot order."""

    indptr: npt.NDArray[np.int64]
    slots: npt.NDArray[np.int32]
    title_tf: Counts  # uint16 where every count fits
    content_tf: Counts

    @classmethod
    def build(
        cls, terms: npt.NDArray[np.int32], slots: npt.NDArray[np.int32], counts: npt.NDArray[np.int32]
    ) -> _Segment:
        """From parallel (term, slot, (title, content) counts) arrays in slot order."""
        order = _stable_order(terms)  # each term's postings stay in slot order
        width = int(terms.max()) + 1 if terms.size else 0
        indptr = np.zeros(width + 1, dtype=np.int64)
        np.cumsum(np.bincount(terms, minlength=width), out=indptr[1:])
        narrow = np.uint16 if counts.size == 0 or int(counts.max()) <= np.iinfo(np.uint16).max else np.int32
        return cls(
            indptr,
            np.ascontiguousarray(slots[order]),
            counts[order, 0].astype(narrow),
            counts[order, 1].astype(narrow),
        )

    @property
    def size(self) -> int:
        return int(self.slots.size)

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.slots.nbytes + self.title_tf.nbytes + self.content_tf.nbytes)

    def of(self, term: int) -> slice:
        if term + 1 >= self.indptr.size:
            return slice(0, 0)
        return slice(int(self.indptr[term]), int(self.indptr[term + 1]))

    def triples(self) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Every posting as (term, slot, counts) arrays, in term order."""
        terms = np.repeat(np.arange(self.indptr.size - 1, dtype=np.int32), np.diff(self.indptr))
        return terms, self.slots, np.stack([self.title_tf, self.content_tf], axis=1).astype(np.int32)


def _stable_order(terms: npt.NDArray[np.int32]) -> npt.NDArray[np.intp]:
    """np.argsort(terms, kind="stable"), as radix sorts of 16-bit keys: the low half, then any high half.

    NumPy's stable sort of int32 keys is a timsort, 3x slower on 7M postings than its radix sort of 16 bits.
    """
    if terms.size == 0 or int(terms.max()) <= np.iinfo(np.uint16).max:
        return np.argsort(terms.astype(np.uint16), kind="stable")
    order = np.argsort((terms & 0xFFFF).astype(np.uint16), kind="stable")
    return order[np.argsort((terms[order] >> 16).astype(np.uint16), kind="stable")]


_NO_SLOTS: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)


def _joined(
    segments: tuple[_Segment, ...],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Segments' postings as one (term, slot, counts) array each, as _Segment.build reads them.

    build wants each term's postings in slot order after its stable sort by term: so they are when the
    segments come oldest first, since a later segment's slots all follow an earlier one's.
    """
    parts = [segment.triples() for segment in segments]
    return (
        np.concatenate([part[0] for part in parts]),
        np.concatenate([part[1] for part in parts]),
        np.concatenate([part[2] for part in parts]),
    )


def _merged_tail(deltas: tuple[_Segment, ...]) -> tuple[_Segment, ...]:
    """The newest two segments merged while the older holds at most twice the newer's postings.

    Sizes then at least double from the newest to the oldest: a few segments for a search to read, and
    each posting merged again only when the segments after it have grown to its own segment's size.
    """
    while len(deltas) > 1 and deltas[-2].size <= 2 * deltas[-1].size:
        deltas = (*deltas[:-2], _Segment.build(*_joined(deltas[-2:])))
    return deltas


def _parse(
    rows: list[PostingRow], first_slot: int
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.float64]]:
    """Rows' blobs as (term, slot, counts) arrays in slot order, and each row's length in tokens."""
    triples = _triples(b"".join(row[3] for row in rows)) if rows else np.zeros((0, 3), dtype=np.int32)
    per_row = np.array([len(row[3]) // (4 * POSTING_FIELDS) for row in rows], dtype=np.int64)
    slots = np.repeat(np.arange(first_slot, first_slot + len(rows), dtype=np.int32), per_row)
    counts = np.ascontiguousarray(triples[:, 1:])
    tokens = counts.sum(axis=1, dtype=np.int64).astype(np.float64)
    lengths = np.bincount(slots - first_slot, weights=tokens, minlength=len(rows)).astype(np.float64)
    return np.ascontiguousarray(triples[:, 0]), slots, counts, lengths


@dataclass(frozen=True)
class KeywordPostings:
    """One version of a collection's postings: slots (chunk rows) [0, size), the dead ones left out."""

    rowids: npt.NDArray[np.int64]  # by slot: the chunk's rowid (FTS5's tie order)
    chunk_ids: list[str]  # by slot, dead slots included
    document_codes: npt.NDArray[np.int32]  # by slot: the code of the chunk's document
    # Document id -> code. Shared by the versions made from one load, only ever added to (under the
    # cache's build lock): a version finds its documents' slots among its own codes.
    codes: dict[str, int]
    lengths: npt.NDArray[np.float64]  # by slot: tokens in title and content (FTS5's D)
    live: npt.NDArray[np.bool_]  # by slot
    live_count: int
    total_tokens: int  # over live slots
    main: _Segment
    deltas: tuple[_Segment, ...]  # postings of the slots appended since `main` was built, oldest first
    # Where rowids, document_codes and lengths are views of: shared by the versions since `main` was
    # built (appended.Column: each version reads only its own slots), as chunk_ids is.
    columns: tuple[Column, Column, Column]

    @classmethod
    def load(cls, batches: Iterable[list[PostingRow]]) -> KeywordPostings:
        """Postings of these chunk rows, in rowid order.

        Each batch's blobs are copied into one growing array as they come: parsed batch by batch and
        joined at the end, the parts stayed on the heap (about 150 MB more resident memory at 100K chunks).
        """
        rowids: list[int] = []
        chunk_ids: list[str] = []
        codes: dict[str, int] = {}
        document_codes: list[int] = []
        per_row: list[int] = []
        triples = np.empty((0, POSTING_FIELDS), dtype=np.int32)
        filled = 0
        for rows in batches:
            batch = _triples(b"".join(row[3] for row in rows))
            if filled + batch.shape[0] > triples.shape[0]:  # grow by half at least (amortized copies)
                grown = np.empty((max(filled + batch.shape[0], 3 * triples.shape[0] // 2), 3), dtype=np.int32)
                grown[:filled] = triples[:filled]
                triples = grown
            triples[filled : filled + batch.shape[0]] = batch
            filled += batch.shape[0]
            per_row.extend(len(row[3]) // (4 * POSTING_FIELDS) for row in rows)
            rowids.extend(row[0] for row in rows)
            chunk_ids.extend(row[1] for row in rows)
            document_codes.extend(codes.setdefault(row[2], len(codes)) for row in rows)
        triples = triples[:filled]
        slots = np.repeat(np.arange(len(per_row), dtype=np.int32), np.array(per_row, dtype=np.int64))
        counts = triples[:, 1:]
        tokens = counts.sum(axis=1, dtype=np.int64).astype(np.float64)
        lengths = np.bincount(slots, weights=tokens, minlength=len(per_row)).astype(np.float64)
        return cls._made(
            np.array(rowids, dtype=np.int64),
            chunk_ids,
            np.array(document_codes, dtype=np.int32),
            codes,
            lengths,
            _Segment.build(np.ascontiguousarray(triples[:, 0]), slots, counts),
        )

    @classmethod
    def _made(
        cls,
        rowids: npt.NDArray[np.int64],
        chunk_ids: list[str],
        document_codes: npt.NDArray[np.int32],
        codes: dict[str, int],
        lengths: npt.NDArray[np.float64],
        main: _Segment,
    ) -> KeywordPostings:
        return cls(
            rowids,
            chunk_ids,
            document_codes,
            codes,
            lengths,
            np.ones(len(chunk_ids), dtype=bool),
            len(chunk_ids),
            int(lengths.sum()),
            main,
            (),
            (Column(rowids), Column(document_codes), Column(lengths)),
        )

    @property
    def nbytes(self) -> int:
        """The memory of the arrays (ids and lookups not counted)."""
        arrays = self.rowids.nbytes + self.document_codes.nbytes + self.lengths.nbytes + self.live.nbytes
        return int(arrays + self.main.nbytes + sum(delta.nbytes for delta in self.deltas))

    def replaced(self, documents: set[str], rows: list[PostingRow]) -> KeywordPostings:
        """A new version: the documents' rows dead, their rows now appended; this one left as it was."""
        wanted = [self.codes[document_id] for document_id in documents if document_id in self.codes]
        dying = np.flatnonzero(np.isin(self.document_codes, wanted) & self.live) if wanted else _NO_SLOTS
        live = np.concatenate([self.live, np.ones(len(rows), dtype=bool)])
        live[dying] = False
        start = self.live.size  # (chunk_ids may be longer: a newer version appended to it)
        terms, slots, counts, lengths = _parse(rows, start)
        added_codes = [self.codes.setdefault(row[2], len(self.codes)) for row in rows]
        deltas = _merged_tail((*self.deltas, _Segment.build(terms, slots, counts)))
        rowid_column, rowids = self.columns[0].extended(start, np.array([r[0] for r in rows], dtype=np.int64))
        code_column, document_codes = self.columns[1].extended(start, np.array(added_codes, dtype=np.int32))
        length_column, all_lengths = self.columns[2].extended(start, lengths)
        made = KeywordPostings(
            rowids,
            extended(self.chunk_ids, start, [row[1] for row in rows]),
            document_codes,
            self.codes,
            all_lengths,
            live,
            self.live_count - int(dying.size) + len(rows),
            self.total_tokens - int(self.lengths[dying].sum()) + int(lengths.sum()),
            self.main,
            deltas,
            (rowid_column, code_column, length_column),
        )
        too_big = sum(d.size for d in deltas) > max(MIN_DELTA_POSTINGS, DELTA_SHARE * self.main.size)
        return (
            made._compacted() if too_big or (live.size - made.live_count) > DEAD_SHARE * live.size else made
        )

    def _compacted(self) -> KeywordPostings:
        """The live slots renumbered in order, their postings in one index."""
        kept = np.flatnonzero(self.live)
        renumber = np.full(self.live.size, -1, dtype=np.int32)
        renumber[kept] = np.arange(kept.size, dtype=np.int32)
        terms, slots, counts = _joined((self.main, *self.deltas))
        alive = self.live[slots]
        return KeywordPostings._made(
            self.rowids[kept],
            [self.chunk_ids[slot] for slot in kept],
            self.document_codes[kept],
            self.codes,
            self.lengths[kept],
            _Segment.build(terms[alive], renumber[slots[alive]], counts[alive]),  # (renumbering keeps order)
        )

    def _postings(self, term: int) -> tuple[npt.NDArray[np.int32], Counts, Counts]:
        """The term's live postings: slots, title counts, content counts."""
        parts = []
        for segment in (self.main, *self.deltas):
            span = segment.of(term)
            slots = segment.slots[span]
            if slots.size:
                title, content = segment.title_tf[span], segment.content_tf[span]
                if self.live_count != self.live.size:
                    alive = self.live[slots]
                    slots, title, content = slots[alive], title[alive], content[alive]
                parts.append((slots, title, content))
        if len(parts) == 1:
            return parts[0]
        if not parts:
            nothing = np.zeros(0, dtype=np.int32)
            return nothing, nothing, nothing
        return (
            np.concatenate([part[0] for part in parts]),
            np.concatenate([part[1] for part in parts]),
            np.concatenate([part[2] for part in parts]),
        )

    def score(
        self, phrases: list[int | None], title_weight: float, top_k: int
    ) -> list[tuple[str, float]] | None:
        """The top_k (chunk id, score), best first (ties by rowid), as FTS5's flat bm25 ranks them.

        phrases: the match expression's phrases in order, each the term id of its one token (None: a term
        no chunk holds). None when an input cannot be answered exactly (a negative title weight).
        """
        if title_weight < 0 or top_k <= 0:
            return None if title_weight < 0 else []
        rows = self.live_count
        average = self.total_tokens / rows if rows else 0.0
        scores = np.zeros(self.live.size, dtype=np.float64)
        matched = np.zeros(self.live.size, dtype=bool)
        computed: dict[int, tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]] = {}
        for term in phrases:
            if term is None:
                continue  # no row holds it: it adds 0.0 to every row
            if term not in computed:
                slots, title, content = self._postings(term)
                computed[term] = (slots, self._term_scores(slots, title, content, title_weight, average))
            slots, term_scores = computed[term]
            scores[slots] += term_scores
            matched[slots] = True
        candidates = np.flatnonzero(matched)
        if candidates.size > top_k:
            found = scores[candidates]
            kth = np.partition(found, found.size - top_k)[found.size - top_k]
            candidates = candidates[found >= kth]  # the ties at the k-th score too: rowid decides
        order = np.lexsort((self.rowids[candidates], -scores[candidates]))[:top_k]
        return [(self.chunk_ids[slot], float(scores[slot])) for slot in candidates[order]]

    def _term_scores(
        self,
        slots: npt.NDArray[np.int32],
        title: Counts,
        content: Counts,
        title_weight: float,
        average: float,
    ) -> npt.NDArray[np.float64]:
        """One phrase's BM25 term on each of its rows, as fts5Bm25Function computes it."""
        hits = slots.size
        idf = math.log((self.live_count - hits + 0.5) / (hits + 0.5))
        if idf <= 0.0:
            idf = BM25_IDF_FLOOR
        frequency = _weighted_counts(title, content, title_weight)
        length = self.lengths[slots]
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average)
        return idf * ((frequency * (BM25_K1 + 1.0)) / (frequency + norm))


def _weighted_counts(title: Counts, content: Counts, title_weight: float) -> npt.NDArray[np.float64]:
    """FTS5's phrase frequency in a row: the title weight once per title instance, then 1.0 per content one.

    When the weight has few significant bits (1.0, 2.5) every partial sum is exact and a product is the same
    double; otherwise the additions are made one by one, as FTS5 makes them.
    """
    scaled = title_weight * 1024
    if scaled == math.floor(scaled) and title_weight < 2**20:
        return title_weight * title.astype(np.float64) + content.astype(np.float64)
    frequency = np.zeros(title.size, dtype=np.float64)
    for count in range(1, int(title.max(initial=0)) + 1):
        frequency = np.where(title >= count, frequency + title_weight, frequency)
    for count in range(1, int(content.max(initial=0)) + 1):
        frequency = np.where(content >= count, frequency + 1.0, frequency)
    return frequency

"""A collection's vectors in memory: one matrix searched exactly, kept up to date document by document.

A write replaces or deletes a few documents; reloading every row of a 100K-chunk collection for it took
seconds. Instead a new version of the matrix marks the documents' old rows dead and appends their new rows
at the end, into room the matrix keeps for that. Versions share one buffer: a version reads only the rows
below its `size`, and no row below a version's size is ever written again, so a search still running on an
older version reads what it always read. When the room runs out, or dead rows pile up, the next version
copies the live rows into a new buffer (compaction, in memory: nothing is read from the database).

A matrix of ANN_MIN_ROWS live rows or more is also searched approximately, through an inverted file
(InvertedLists): spherical k-means centroids over its rows, each row assigned to its nearest centroid; a
query scores the centroids, takes the rows of the PROBE_SHARE best lists and ranks only those exactly. An
exact scan of 100K rows reads 150 MB per query; the probed lists are a tenth of that. The assignments live
beside the buffer and follow the same rule (rows below a version's size never written again); appended
rows go to their nearest centroid; the centroids are trained again when the live rows have doubled since.
Below ANN_MIN_ROWS, and under a metadata filter, every search is exact. The store passes both knobs
(SQLITE_ANN_MIN_CHUNKS, where 0 means always exact, and SQLITE_ANN_PROBE_SHARE); these are their defaults.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from iris_rag.backends.sqlite.overlay import Overlay
from iris_rag.stores.appended import extended

# Room past the last row: an eighth of the rows, at least this many (a one-document ingest appends in place).
MIN_SPARE_ROWS = 64
# Dead rows that make the next version compact: more than this many and more than a quarter of the rows.
MIN_DEAD_TO_COMPACT = 1024
# Live rows from which searches without a filter go through the inverted file (a 20K-row scan takes ~3 ms).
ANN_MIN_ROWS = 20_000
# The share of the lists a query probes (at least MIN_PROBES of them): recall@10 0.97 at 100K rows.
PROBE_SHARE = 0.1
MIN_PROBES = 8
# k-means: rows sampled per list for training, iterations, and the seed (the same rows give the same lists).
TRAIN_ROWS_PER_LIST = 64
TRAIN_ITERATIONS = 8
TRAIN_SEED = 13
# Rows scored against the centroids at a time while assigning (bounds the temporary rows x lists matrix).
ASSIGN_BATCH = 16_384


def _approximate(live_rows: int, min_rows: int | None) -> bool:
    """Whether a matrix of this many live rows has an inverted file (0: never; None: ANN_MIN_ROWS)."""
    threshold = ANN_MIN_ROWS if min_rows is None else min_rows
    return threshold > 0 and live_rows >= threshold


def _capacity(rows: int) -> int:
    return rows + max(MIN_SPARE_ROWS, rows // 8)


class _Buffer:
    """Rows of vectors with room to grow. Rows below `filled` are never written again."""

    def __init__(self, capacity: int, dimension: int) -> None:
        self.array: npt.NDArray[np.float32] = np.empty((capacity, dimension), dtype=np.float32)
        self.filled = 0


class InvertedLists:
    """Centroids and each row's list, for rows [0, filled) of one buffer.

    `assignment` has the buffer's capacity; like the buffer's rows, an assignment below `filled` is never
    written again, so the versions sharing it each read their own rows' lists.
    """

    def __init__(self, centroids: npt.NDArray[np.float32], capacity: int, trained_rows: int) -> None:
        self.centroids = centroids
        self.assignment: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.trained_rows = trained_rows

    @property
    def lists(self) -> int:
        """How many lists (centroids)."""
        return int(self.centroids.shape[0])

    def assign(self, start: int, vectors: npt.NDArray[np.float32]) -> None:
        """Put rows start.. (these vectors) in their nearest centroid's list."""
        for offset in range(0, vectors.shape[0], ASSIGN_BATCH):
            part = vectors[offset : offset + ASSIGN_BATCH]
            nearest = np.argmax(part @ self.centroids.T, axis=1).astype(np.int32)
            self.assignment[start + offset : start + offset + part.shape[0]] = nearest

    def rows_in(self, lists: npt.NDArray[np.intp], size: int) -> npt.NDArray[np.intp]:
        """The rows below `size` assigned to these lists, ascending."""
        wanted = np.zeros(self.lists, dtype=bool)
        wanted[lists] = True
        return np.flatnonzero(wanted[self.assignment[:size]])

    @classmethod
    def train(cls, rows: npt.NDArray[np.float32], capacity: int) -> InvertedLists:
        """Spherical k-means over a sample of the (unit) rows, about sqrt(rows) lists; every row assigned."""
        count = rows.shape[0]
        lists = min(count, max(16, int(np.sqrt(count))))
        rng = np.random.default_rng(TRAIN_SEED)
        sample_size = min(count, lists * TRAIN_ROWS_PER_LIST)
        sample = rows[np.sort(rng.choice(count, sample_size, replace=False))]
        centroids = sample[rng.choice(sample_size, lists, replace=False)].copy()
        for _ in range(TRAIN_ITERATIONS):
            nearest = np.argmax(sample @ centroids.T, axis=1)
            sums = np.zeros_like(centroids)
            np.add.at(sums, nearest, sample)
            norms = np.linalg.norm(sums, axis=1)
            filled = norms > 0  # an empty list keeps its centroid
            centroids[filled] = sums[filled] / norms[filled, None]
        made = cls(centroids.astype(np.float32), capacity, count)
        made.assign(0, rows)
        return made

    def carried(self, rows: npt.NDArray[np.intp], capacity: int) -> InvertedLists:
        """The same centroids for a compacted buffer holding these old rows, in order."""
        moved = InvertedLists(self.centroids, capacity, self.trained_rows)
        moved.assignment[: rows.size] = self.assignment[rows]
        return moved


# One batch of rows as read from the database: chunk ids, their document ids, their vectors (float32 bytes).
Batch = tuple[list[str], list[str], list[bytes]]


@dataclass(frozen=True)
class VectorMatrix:
    """One version of a collection's vectors: rows [0, size) of a buffer, the `dead` ones left out."""

    buffer: _Buffer
    size: int
    # By row, dead rows included; shared like the buffer (a version reads only the entries below its size).
    chunk_ids: list[str]
    document_ids: list[str]
    row_of: Overlay[str, int]  # live rows only
    rows_of_document: Overlay[str, list[int]]  # live rows only
    dead: npt.NDArray[np.intp]
    inverted: InvertedLists | None = None  # from ANN_MIN_ROWS live rows up

    @classmethod
    def load(cls, batches: Iterable[Batch], expected_rows: int, min_rows: int | None = None) -> VectorMatrix:
        """A matrix of every row read, in order, with room for `expected_rows` and some spare.

        min_rows: the live rows from which it gets an inverted file (0: never; None: ANN_MIN_ROWS).
        """
        buffer: _Buffer | None = None
        chunk_ids: list[str] = []
        document_ids: list[str] = []
        for batch_chunks, batch_documents, blobs in batches:
            if not blobs:
                continue
            vectors = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1)
            if buffer is None:
                buffer = _Buffer(_capacity(max(expected_rows, len(blobs))), vectors.shape[1])
            elif buffer.filled + len(blobs) > buffer.array.shape[0]:  # more rows than counted: grow
                grown = _Buffer(_capacity(buffer.filled + len(blobs)), buffer.array.shape[1])
                grown.array[: buffer.filled] = buffer.array[: buffer.filled]
                grown.filled, buffer = buffer.filled, grown
            buffer.array[buffer.filled : buffer.filled + len(blobs)] = vectors
            buffer.filled += len(blobs)
            chunk_ids.extend(batch_chunks)
            document_ids.extend(batch_documents)
        if buffer is None:
            buffer = _Buffer(0, 0)
        return cls._indexed(buffer, chunk_ids, document_ids)._with_lists(min_rows)

    def _with_lists(self, min_rows: int | None) -> VectorMatrix:
        """The version with an inverted file, trained if it is large enough and has none (or has doubled)."""
        live = self.live_count
        if not _approximate(live, min_rows):
            return self
        if self.inverted is not None and live <= 2 * self.inverted.trained_rows:
            return self
        if self.dead.size:  # train on live rows only: compact first (an ingest that crossed the threshold)
            return self._compacted(set(), 0, None)._with_lists(min_rows)
        inverted = InvertedLists.train(self.buffer.array[: self.size], self.buffer.array.shape[0])
        return VectorMatrix(
            self.buffer,
            self.size,
            self.chunk_ids,
            self.document_ids,
            self.row_of,
            self.rows_of_document,
            self.dead,
            inverted,
        )

    @classmethod
    def _indexed(cls, buffer: _Buffer, chunk_ids: list[str], document_ids: list[str]) -> VectorMatrix:
        """Every row of the buffer live, with its lookups built."""
        rows_of_document: dict[str, list[int]] = {}
        for row, document_id in enumerate(document_ids):
            rows_of_document.setdefault(document_id, []).append(row)
        row_of = {chunk_id: row for row, chunk_id in enumerate(chunk_ids)}
        return cls(
            buffer,
            buffer.filled,
            chunk_ids,
            document_ids,
            Overlay(row_of),
            Overlay(rows_of_document),
            _NO_ROWS,
        )

    @property
    def live_count(self) -> int:
        """How many chunks a search considers."""
        return len(self.row_of)

    @property
    def nbytes(self) -> int:
        """The memory of the buffer (shared with the versions before this one)."""
        return int(self.buffer.array.nbytes)

    def scores(self, query_vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The dot product of every row with the query; -inf for dead rows."""
        scores = self.buffer.array[: self.size] @ query_vector.astype(np.float32)
        if self.dead.size:
            scores[self.dead] = -np.inf
        return scores

    def approximate_top(
        self,
        query_vector: npt.NDArray[np.float32],
        top_k: int,
        min_rows: int | None = None,
        probe_share: float | None = None,
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]] | None:
        """The live rows of the lists nearest the query, with their scores; None when it must be exact.

        Approximate: a neighbour assigned to a list not probed is missed (recall@10 against the exact
        search is in docs/benchmarks.md). Exact (None) below min_rows live rows (always when min_rows is
        0), and when the probed lists hold fewer live rows than top_k. probe_share: the share of the lists
        probed (at least MIN_PROBES of them). None: ANN_MIN_ROWS and PROBE_SHARE.
        """
        inverted = self.inverted
        if inverted is None or not _approximate(self.live_count, min_rows) or top_k <= 0:
            return None
        probe_share = PROBE_SHARE if probe_share is None else probe_share
        query = query_vector.astype(np.float32)
        centroid_scores = inverted.centroids @ query
        probes = min(inverted.lists, max(MIN_PROBES, round(inverted.lists * probe_share)))
        nearest = np.argpartition(-centroid_scores, probes - 1)[:probes]
        rows = self._live(inverted.rows_in(nearest, self.size))
        if rows.size < top_k:
            return None
        return rows, self.buffer.array[rows] @ query

    def _live(self, rows: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        return rows[~np.isin(rows, self.dead)] if self.dead.size else rows

    def row_scores(self, rows: list[int], query_vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The dot product of the given (live) rows with the query."""
        return self.buffer.array[rows] @ query_vector.astype(np.float32)

    def replaced(
        self, documents: set[str], batches: Iterable[Batch], min_rows: int | None = None
    ) -> VectorMatrix:
        """A new version: the documents' rows dead, the rows read for them now appended.

        A document written since is replaced, one deleted since just loses its rows (nothing is read for
        it). This version is left as it was.
        """
        chunk_ids: list[str] = []
        document_ids: list[str] = []
        blobs: list[bytes] = []
        for batch_chunks, batch_documents, batch_blobs in batches:
            chunk_ids.extend(batch_chunks)
            document_ids.extend(batch_documents)
            blobs.extend(batch_blobs)
        width = self.buffer.array.shape[1]
        vectors = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(blobs), -1 if blobs else width)
        dying = [row for document_id in documents for row in self.rows_of_document.get(document_id, ())]
        added = len(chunk_ids)
        fits = (
            self.buffer.filled == self.size
            and self.size + added <= self.buffer.array.shape[0]
            and (added == 0 or self.buffer.array.shape[1] == vectors.shape[1])
        )
        dead_after = self.dead.size + len(dying)
        if not fits or dead_after > max(MIN_DEAD_TO_COMPACT, self.size // 4):
            compacted = self._compacted(set(dying), added, vectors.shape[1] if added else None)
            return compacted._appended(chunk_ids, document_ids, vectors)._with_lists(min_rows)
        dead = np.concatenate([self.dead, np.array(dying, dtype=np.intp)]) if dying else self.dead
        kept = VectorMatrix(
            self.buffer,
            self.size,
            self.chunk_ids,
            self.document_ids,
            self.row_of,
            self.rows_of_document,
            dead,
            self.inverted,
        )
        return kept._appended(chunk_ids, document_ids, vectors, dying, documents)._with_lists(min_rows)

    def _appended(
        self,
        chunk_ids: list[str],
        document_ids: list[str],
        vectors: npt.NDArray[np.float32],
        dying: Iterable[int] = (),
        documents: Iterable[str] = (),
    ) -> VectorMatrix:
        """These rows written past `size` (room checked by the caller); `documents` and `dying` rows out.

        `documents`' entries and the `dying` rows' chunks leave the lookups (the rows are already dead, or
        gone in a compacted copy).
        """
        start, end = self.size, self.size + len(chunk_ids)
        if chunk_ids:
            self.buffer.array[start:end] = vectors
            self.buffer.filled = end
            if self.inverted is not None:
                self.inverted.assign(start, vectors)
        # The rows are whole documents' (replaced() reads every chunk of a document written): their entries
        # are new, not added to.
        added_rows: dict[str, list[int]] = {}
        for row, document_id in enumerate(document_ids, start):
            added_rows.setdefault(document_id, []).append(row)
        row_of = self.row_of.changed(
            [self.chunk_ids[row] for row in dying], zip(chunk_ids, range(start, end), strict=True)
        )
        rows_of_document = self.rows_of_document.changed(documents, added_rows.items())
        return VectorMatrix(
            self.buffer,
            end,
            extended(self.chunk_ids, self.size, chunk_ids),
            extended(self.document_ids, self.size, document_ids),
            row_of,
            rows_of_document,
            self.dead,
            self.inverted,
        )

    def _compacted(self, dying: set[int], extra_rows: int, dimension: int | None) -> VectorMatrix:
        """The live rows (less `dying`) copied, in order, into a new buffer with room for extra_rows more."""
        keep = np.ones(self.size, dtype=bool)
        if self.dead.size:
            keep[self.dead] = False
        if dying:
            keep[list(dying)] = False
        rows = np.flatnonzero(keep)
        width = self.buffer.array.shape[1] if rows.size or dimension is None else dimension
        buffer = _Buffer(_capacity(rows.size + extra_rows), width)
        buffer.array[: rows.size] = self.buffer.array[rows]
        buffer.filled = int(rows.size)
        compacted = VectorMatrix._indexed(
            buffer, [self.chunk_ids[row] for row in rows], [self.document_ids[row] for row in rows]
        )
        if self.inverted is None or buffer.array.shape[1] != self.inverted.centroids.shape[1]:
            return compacted
        inverted = self.inverted.carried(rows, buffer.array.shape[0])
        return VectorMatrix(
            compacted.buffer,
            compacted.size,
            compacted.chunk_ids,
            compacted.document_ids,
            compacted.row_of,
            compacted.rows_of_document,
            compacted.dead,
            inverted,
        )


_NO_ROWS: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)

"""Each collection's keyword vocabulary (stemmed term -> chunks holding it), kept while it is close enough.

rag_crag's evaluator and keyword reformulation weigh terms by IDF, and rag_hybrid_ifind's fuzzy repair
looks for misspelled terms in it. Reading it is a scan of the whole keyword index (SQLite's fts5vocab
counts every term's doclist): about 90 ms at 10K chunks, 1.5-2.7 s at 1M. Read again after every write,
that was the first call's time after each one (docs/benchmarks.md, "The first call after a write").

A read is kept until the collection has changed enough to move what is derived from it: its chunk count
by more than STALE_SHARE, or MAX_VERSIONS writes, or the collection made again. Until then IDFs are
those of a collection within 1 % of the current one, and a term written since reads as unknown (df 0:
the rarest, which a new term usually is). Where "unknown" decides what happens (fuzzy repair replaces
unknown terms), `current=True` reads the vocabulary of the current version.
"""

from __future__ import annotations

from dataclasses import dataclass

from iris_rag.stores.base import CollectionInfo, DocumentStore
from iris_rag.stores.versioned import VersionedCache

STALE_SHARE = 0.01
"""A read is kept while the chunk count is within this share of the count it was read at..."""
MAX_VERSIONS = 64
"""...and for fewer than this many data versions (writes) after it."""


def still_close(held_count: int, held_version: int, count: int, version: int) -> bool:
    """Whether a statistic computed over `held_count` items at `held_version` still stands for now.

    The rule of the vocabulary, ColBERT's IDF and the graph's largest component: within STALE_SHARE of
    the count, fewer than MAX_VERSIONS writes since.
    """
    return version - held_version < MAX_VERSIONS and abs(count - held_count) <= STALE_SHARE * held_count


@dataclass(frozen=True, slots=True)
class _Read:
    counts: dict[str, int]
    version: int
    chunk_count: int
    created_at: str

    def close_to(self, collection: CollectionInfo) -> bool:
        return collection.created_at == self.created_at and still_close(
            self.chunk_count, self.version, collection.chunk_count, collection.version
        )


class Vocabularies:
    """The vocabularies of a technique's collections (the store's term_document_counts)."""

    def __init__(self, store: DocumentStore) -> None:
        self._store = store
        self._cache: VersionedCache[_Read] = VersionedCache()

    def get(self, collection: CollectionInfo, *, current: bool = False) -> dict[str, int]:
        """The collection's vocabulary: read at this version with `current`, else possibly a close one."""
        read = self._cache.get(
            collection.id,
            collection.version,
            lambda: self._read_now(collection),
            lambda _, held: held if not current and held.close_to(collection) else None,
        )
        if current and read.version < collection.version:  # (kept for this version by an earlier get)
            self._cache.discard(collection.id)
            read = self._cache.get(collection.id, collection.version, lambda: self._read_now(collection))
        return read.counts

    def _read_now(self, collection: CollectionInfo) -> _Read:
        counts = self._store.term_document_counts(collection.id)
        return _Read(counts, collection.version, collection.chunk_count, collection.created_at)

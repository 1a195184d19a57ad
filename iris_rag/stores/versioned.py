"""Caches of a collection's derived state, keyed by the data version the database holds.

Every process that opens the store keeps its own caches (vector matrix, keyword postings, NodeRAG leaves,
graph entities, keyword vocabularies, ColBERT IDF). They all follow one rule: a value is built for the
collection's data version (DocumentStore.data_version, bumped by the database in every transaction that
changes the collection's documents, whichever process commits it) and rebuilt on the first call that reads a
newer version. The version is read BEFORE the build, so a value holds that version's data or newer, never
older.

A cache may also bring a held value up to date instead of building it again (`update`): the SQLite vector
matrix and keyword postings, NodeRAG's leaf matrix and GraphRAG's entity table read only the documents the
store's change log (DocumentStore.changed_documents) names since the held version. The same rule holds: the
update reads what changed after the held version, so the value it returns holds the asked version's data or
newer. Where the log cannot tell (a gap, too many documents), the value is built again. The keyword
vocabularies (retrieval/vocabulary.py) and ColBERT's IDF use `update` to keep a read while the collection
stays within 1 % of it: statistics, for which a close version will do (a full read of the vocabulary costs a
scan of the index).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_DOCUMENTS_TO_UPDATE = 1000
"""Changed documents up to which a held value is brought up to date (or a quarter of its units, see below)."""


def update_limit(units: int) -> int:
    """How many changed documents a held value over `units` (its documents, or chunks) is updated for.

    Past a quarter of them (and MAX_DOCUMENTS_TO_UPDATE), one sequential read of the whole is cheaper.
    """
    return max(MAX_DOCUMENTS_TO_UPDATE, units // 4)


def logged_documents(
    changes: Iterable[tuple[int, str]], since: int, through: int, limit: int
) -> set[str] | None:
    """The documents a change log's (version, document id) rows after version `since` name.

    None when a reload is due: a version of (since, through] has no row (pruned, or moved on by a process
    of an earlier schema, whose writes log nothing) or more than `limit` documents changed. Rows past
    `through` are named too (newer data, as good). The rule of DocumentStore.changed_documents, one for
    every backend's log.
    """
    versions: set[int] = set()
    documents: set[str] = set()
    for version, document_id in changes:
        if version <= through:
            versions.add(int(version))
        documents.add(str(document_id))
    if len(versions) != through - since:
        return None
    return documents if len(documents) <= limit else None


class VersionedCache(Generic[T]):
    """One value per collection, built for a data version and rebuilt when the version moved on.

    A build blocks only the callers that want the same collection; snapshot() never waits for a build
    (health and stats read it while a large matrix loads).
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, T]] = {}
        self._builds: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()  # held only to read or swap entries, never during a build

    def _fresh(self, collection_id: str, version: int) -> T | None:
        with self._guard:
            entry = self._entries.get(collection_id)
        # An entry built for a newer version than asked holds newer data still: as good.
        return entry[1] if entry is not None and entry[0] >= version else None

    def get(
        self,
        collection_id: str,
        version: int,
        build: Callable[[], T],
        update: Callable[[int, T], T | None] | None = None,
    ) -> T:
        """The value for this version (or newer), built by `build` if there is none yet.

        `update(held_version, held_value)`: the held value of an older version brought up to this one, or
        None when it cannot be (then `build` runs). Either runs under the collection's build lock.
        """
        value = self._fresh(collection_id, version)
        if value is not None:
            return value
        with self._guard:
            lock = self._builds.setdefault(collection_id, threading.Lock())
        with lock:  # one build per collection at a time; the others wait for it and reuse it
            value = self._fresh(collection_id, version)
            if value is not None:
                return value
            held = self._held(collection_id) if update is not None else None
            updated = update(*held) if update is not None and held is not None else None
            value = build() if updated is None else updated
            with self._guard:
                current = self._entries.get(collection_id)
                if current is None or current[0] <= version:
                    self._entries[collection_id] = (version, value)
            return value

    def _held(self, collection_id: str) -> tuple[int, T] | None:
        with self._guard:
            return self._entries.get(collection_id)

    def discard(self, collection_id: str) -> None:
        """Forget the collection's value (the next get builds it again)."""
        with self._guard:
            self._entries.pop(collection_id, None)

    def snapshot(self) -> dict[str, T]:
        """The values held now, by collection (no waiting for builds in progress)."""
        with self._guard:
            return {collection_id: value for collection_id, (_, value) in self._entries.items()}

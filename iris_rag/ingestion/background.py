"""The background index builder: technique indexes built after the ingest has committed the core.

With INDEX_BUILD=background (the default) an ingest commits documents, chunks, vectors and keyword rows and
returns; the technique indexes that can say which documents they hold (DocumentCoverage: ColBERT's token
rows, NodeRAG's trees, the GraphRAG graph) are built afterwards by one thread of the worker, a job per
ingest batch (at most JOB_DOCUMENTS documents, as `iris-rag ingest` batches), in the job's document order:

1. read the batch's documents back from the store, with their chunks and vectors, and fingerprint each
   (title, content, metadata, update time, chunk spans);
2. each index's prepare() over them, outside any transaction: the model work, on the encoder's bulk slices,
   behind every query's encode;
3. per index, one short transaction (DocumentStore.index_transaction) that waits for the collection's
   other writers, keeps only the documents whose fingerprint is unchanged (a document replaced meanwhile
   has a newer job of its own; a deleted one is gone), clears any rows they have and writes the prepared
   rows: the same rows an inline ingest of the same batch writes (tests/ingestion/test_background.py).

Nothing is persisted but the indexes themselves: at start, and on rescan(), the builder asks each index
which documents it lacks and queues them, so a worker killed mid-build loses nothing. The worker scans
every collection at start; a CLI command only the collection it writes (none for one that only reads: a
short process would start builds it abandons at exit), so what nothing builds reads as incomplete. A
deleted collection cancels its jobs (the running one at its next encode slice). State per collection and
index (ready, building n of m, failed with the error, incomplete) is what rag_health_check reports; a
technique called meanwhile answers from what is indexed and says so (Pipeline.index_note).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import orjson

from iris_rag.backends import connection_failure
from iris_rag.cancellation import CancelToken, cancellation_scope, check_cancelled
from iris_rag.errors import RequestCancelledError
from iris_rag.stores.base import ChunkInput, DocumentInput, DocumentStore, StoredDocument
from iris_rag.stores.technique_index import DocumentCoverage, TechniqueIndex

logger = logging.getLogger(__name__)

QUIET_S = 0.5
"""The builder starts a job, or a job's next index, only once no ingest has run for this long: the core of
an ingest keeps the encoder to itself (batches ingested back to back, as the CLI does, are not slowed)."""
JOB_DOCUMENTS = 256
"""Documents per job at most (as the CLI ingests): an inline ingest of such a batch writes the same rows."""
RETRY_AFTER_S = 5.0
"""A job that lost the database connection (a server restart) is tried once more after this long."""


@dataclass(frozen=True, slots=True)
class Job:
    """Documents of one collection whose technique indexes are to be built, in order."""

    collection_id: str
    document_ids: tuple[str, ...]
    retried: bool = False  # already put back once after the database connection was lost


@dataclass(frozen=True, slots=True)
class _Loaded:
    document: DocumentInput
    fingerprint: bytes


def document_fingerprint(store: DocumentStore, collection_id: str, document_id: str) -> bytes | None:
    """What a document's index rows depend on, hashed; None if the document is gone."""
    read = fingerprinted_document(store, collection_id, document_id)
    return None if read is None else read[1]


def fingerprinted_document(
    store: DocumentStore, collection_id: str, document_id: str
) -> tuple[StoredDocument, bytes] | None:
    """A document read back with its fingerprint (document_fingerprint); None if it is gone.

    A document replaced between its two reads has a fingerprint of neither version: never found again.
    """
    document = store.get_document(collection_id, document_id)
    if document is None:
        return None
    chunks = store.get_document_chunks(collection_id, document_id)
    fingerprint = _fingerprint(
        document.title,
        document.content,
        document.metadata,
        document.updated_at,
        [(c.index, c.start_char, c.end_char, c.content) for c in chunks],
    )
    return document, fingerprint


def _fingerprint(
    title: str,
    content: str,
    metadata: dict[str, Any],
    updated_at: str,
    chunks: list[tuple[int, int, int, str]],
) -> bytes:
    payload = orjson.dumps([title, content, metadata, updated_at, chunks], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(payload).digest()


class IndexBuilder:
    """One thread that builds the technique indexes of committed documents, jobs in arrival order."""

    def __init__(self, store: DocumentStore) -> None:
        self.store = store
        self.indexes: dict[str, TechniqueIndex] = {}  # technique name -> its index (a DocumentCoverage)
        self._condition = threading.Condition()
        self._jobs: deque[Job] = deque()
        self._running: Job | None = None
        self._token: CancelToken | None = None
        self._failures: dict[tuple[str, str], str] = {}  # (collection, technique) -> the error
        self._scanned = threading.Event()
        self._scan: tuple[str, ...] | None = None  # the collections of the start-up scan (None: all)
        self._closed = False
        self._ingesting = 0
        self._last_ingest = 0.0
        self._thread: threading.Thread | None = None
        self.documents_built = 0
        self.jobs_done = 0

    def add(self, technique: str, index: TechniqueIndex) -> bool:
        """Build this technique's index in the background if it can say which documents it holds."""
        if not isinstance(index, DocumentCoverage):
            return False
        self.indexes[technique] = index
        return True

    def builds(self, index: TechniqueIndex) -> bool:
        """Whether this index is built here (and so left out of the ingest's transaction)."""
        return any(index is mine for mine in self.indexes.values())

    # Lifecycle
    def start(self, collections: Sequence[str] | None = None) -> None:
        """Start the thread; its first work is a scan for the documents an index lacks.

        `collections`: the collections scanned (None: every one, as the worker does).
        """
        self._scan = None if collections is None else tuple(collections)
        if self._thread is not None or not self.indexes:
            self._scanned.set()
            return
        self._thread = threading.Thread(target=self._run, name="iris-rag-index-builder", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop: queued jobs are dropped (a later start finds their documents), the running one cancelled."""
        with self._condition:
            self._closed = True
            self._jobs.clear()
            if self._token is not None:
                self._token.cancel("the worker is stopping")
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    # Work in
    @contextmanager
    def core_ingest(self) -> Iterator[None]:
        """Mark an ingest's core work (the builder defers to it: see QUIET_S)."""
        with self._condition:
            self._ingesting += 1
        try:
            yield
        finally:
            with self._condition:
                self._ingesting -= 1
                self._last_ingest = time.monotonic()
                self._condition.notify_all()

    def _defer_to_ingests(self) -> None:
        """Wait until no ingest is running and none has for QUIET_S (or the builder is closing)."""
        with self._condition:
            while not self._closed:
                if self._ingesting:
                    self._condition.wait(1.0)
                    continue
                quiet = time.monotonic() - self._last_ingest
                if quiet >= QUIET_S:
                    return
                self._condition.wait(QUIET_S - quiet)

    def submit(self, collection_id: str, document_ids: list[str]) -> None:
        """Queue the indexes of documents just committed (a replaced document's old rows went with it)."""
        if not self.indexes or not document_ids:
            return
        with self._condition:
            if self._closed:
                return  # a later start finds these documents
            for start in range(0, len(document_ids), JOB_DOCUMENTS):
                self._jobs.append(Job(collection_id, tuple(document_ids[start : start + JOB_DOCUMENTS])))
            self._condition.notify_all()

    def rescan(self, collection_id: str | None = None) -> int:
        """Queue every document an index lacks that no job holds yet (one collection, or all); how many.

        The collection's failures are cleared: their documents are tried again.
        """
        collections = (
            [collection_id] if collection_id is not None else [c.id for c in self.store.list_collections()]
        )
        queued = 0
        for collection in collections:
            with self._condition:
                jobs = [*self._jobs, *([self._running] if self._running else [])]
                held = {d for j in jobs if j.collection_id == collection for d in j.document_ids}
                for key in [k for k in self._failures if k[0] == collection]:
                    del self._failures[key]
            missing = [d for d in self.missing_documents(collection) if d not in held]
            self.submit(collection, missing)
            queued += len(missing)
        return queued

    def missing_documents(self, collection_id: str) -> list[str]:
        """The collection's documents, in stored order, that at least one index lacks."""
        info = self.store.get_collection(collection_id)
        if info is None:
            return []
        lacking: set[str] = set()
        all_ids: list[str] | None = None
        for index in self.indexes.values():
            if index.indexed_documents(collection_id) >= info.document_count:
                continue
            if all_ids is None:
                all_ids = self.store.document_ids(collection_id)
            assert isinstance(index, DocumentCoverage)
            held = index.indexed_document_ids(collection_id)
            lacking.update(d for d in all_ids if d not in held)
        return [d for d in all_ids or [] if d in lacking]

    def cancel_collection(self, collection_id: str) -> None:
        """Drop the collection's queued jobs and cancel its running one (the collection is being deleted)."""
        with self._condition:
            self._jobs = deque(j for j in self._jobs if j.collection_id != collection_id)
            if self._running is not None and self._running.collection_id == collection_id and self._token:
                self._token.cancel(f"collection {collection_id!r} was deleted")
            for key in [k for k in self._failures if k[0] == collection_id]:
                del self._failures[key]

    # State out
    def pending(self, collection_id: str) -> bool:
        """Whether work for the collection is queued or running, or a start-up scan of it is not done."""
        if not self._scanned.is_set():
            return self._thread is not None and (self._scan is None or collection_id in self._scan)
        with self._condition:
            running = self._running is not None and self._running.collection_id == collection_id
            return running or any(j.collection_id == collection_id for j in self._jobs)

    def queued_documents(self, collection_id: str | None = None) -> int:
        """Documents waiting in jobs (one collection's, or all), the running job's included."""
        with self._condition:
            jobs = [*self._jobs, *([self._running] if self._running else [])]
        return sum(len(j.document_ids) for j in jobs if collection_id in (None, j.collection_id))

    def state(self, collection_id: str, documents: int) -> dict[str, dict[str, Any]]:
        """Per technique: ready, building (indexed of documents) or failed (with the error)."""
        pending = self.pending(collection_id)
        states: dict[str, dict[str, Any]] = {}
        for technique, index in sorted(self.indexes.items()):
            indexed = index.indexed_documents(collection_id)
            failure = self._failures.get((collection_id, technique))
            if failure is not None:
                state = "failed"
            elif indexed >= documents:
                state = "ready"
            else:  # incomplete: not queued; `iris-rag reindex`, a worker's start or an eval of it queues it
                state = "building" if pending else "incomplete"
            states[technique] = {"state": state, "indexed_documents": indexed, "documents": documents}
            if failure is not None:
                states[technique]["error"] = failure
        return states

    def failures(self) -> dict[tuple[str, str], str]:
        """(collection, technique) -> the error of its last failed job."""
        with self._condition:
            return dict(self._failures)

    def wait(
        self,
        collection_id: str | None = None,
        *,
        timeout: float | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> bool:
        """Block until no work for the collection (or any) is queued or running; False on timeout.

        `on_progress` hears how many documents are still queued, about once a second.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._thread is not None:
            self._scanned.wait(timeout)
        while True:
            left = self.queued_documents(collection_id)
            if left == 0:
                return True
            if on_progress is not None:
                on_progress(left)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            with self._condition:
                self._condition.wait(1.0 if remaining is None else min(1.0, remaining))

    # The thread
    def _run(self) -> None:
        try:
            for collection in self._scan if self._scan is not None else [None]:
                self.rescan(collection)
        except Exception:
            logger.exception("index builder: the start-up scan failed; new ingests are still built")
        finally:
            self._scanned.set()
        while True:
            with self._condition:
                while not self._jobs and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
            self._defer_to_ingests()
            with self._condition:
                if self._closed:
                    return
                if not self._jobs:  # cancelled meanwhile (its collection deleted)
                    continue
                job = self._jobs.popleft()
                self._running, self._token = job, CancelToken()
                token = self._token
            started = time.perf_counter()
            try:
                with cancellation_scope(token):
                    self.build(job)
                logger.info(
                    "index builder: %d documents of %r in %.1f s",
                    len(job.document_ids),
                    job.collection_id,
                    time.perf_counter() - started,
                )
            except RequestCancelledError:
                logger.info("index builder: %s", token.reason)
            except Exception as exc:
                self._failed(job, exc)
            finally:
                with self._condition:
                    self._running, self._token = None, None
                    self.jobs_done += 1
                    self._condition.notify_all()

    def _failed(self, job: Job, exc: Exception) -> None:
        """A job that raised: put back once when the database went away (a restart), else recorded.

        Recorded per index, so health says degraded with the reason and the technique's INDEX_NOT_BUILT
        names it; a rescan (the next ingest's, or a restart's) builds the documents again.
        """
        if connection_failure(exc) is not None and not job.retried:
            logger.warning(
                "index builder: the database connection was lost; job for %r again in %.0f s",
                job.collection_id,
                RETRY_AFTER_S,
            )
            with self._condition:
                self._condition.wait_for(lambda: self._closed, timeout=RETRY_AFTER_S)
                if not self._closed:
                    self._jobs.appendleft(replace(job, retried=True))
            return
        logger.exception("index builder: job for %r failed", job.collection_id, exc_info=exc)
        error = f"{type(exc).__name__}: {exc}"[:500]
        with self._condition:
            for technique in self.indexes:
                self._failures[(job.collection_id, technique)] = error

    def build(self, job: Job) -> None:
        """Build every index's rows for the job's documents (on the calling thread)."""
        loaded = [item for d in job.document_ids if (item := self._load(job.collection_id, d)) is not None]
        if not loaded:
            return
        for technique, index in self.indexes.items():
            assert isinstance(index, DocumentCoverage)
            held = index.indexed_document_ids(job.collection_id)
            todo = [item for item in loaded if item.document.id not in held]
            if not todo:
                continue
            self._defer_to_ingests()
            check_cancelled()
            try:
                prepared = index.prepare(job.collection_id, [item.document for item in todo])
                self._write(job.collection_id, index, todo, prepared)
            except RequestCancelledError:
                raise
            except Exception as exc:
                if connection_failure(exc) is not None:
                    raise  # the whole job waits for the database (_failed), not only this index
                error = f"{type(exc).__name__}: {exc}"[:500]
                logger.exception("index builder: the %s index of %r failed", technique, job.collection_id)
                with self._condition:
                    self._failures[(job.collection_id, technique)] = error

    def _load(self, collection_id: str, document_id: str) -> _Loaded | None:
        document = self.store.get_document(collection_id, document_id)
        if document is None:
            return None
        chunks = self.store.get_document_chunks(collection_id, document_id)
        vectors = self.store.chunk_vectors(collection_id, [c.chunk_id for c in chunks])
        if len(vectors) < len(chunks):
            return None  # replaced or deleted between the two reads: the newer version has its own job
        inputs = [
            ChunkInput(c.index, c.content, c.start_char, c.end_char, vectors[c.chunk_id]) for c in chunks
        ]
        fingerprint = _fingerprint(
            document.title,
            document.content,
            document.metadata,
            document.updated_at,
            [(c.index, c.start_char, c.end_char, c.content) for c in chunks],
        )
        return _Loaded(
            DocumentInput(document.id, document.title, document.content, dict(document.metadata), inputs),
            fingerprint,
        )

    def _write(self, collection_id: str, index: TechniqueIndex, todo: list[_Loaded], prepared: Any) -> None:
        """The prepared rows of the documents still as they were read, in one transaction."""
        written = [item.document.id for item in todo]
        with self.store.index_transaction(collection_id, written):
            current = [
                item
                for item in todo
                if document_fingerprint(self.store, collection_id, item.document.id) == item.fingerprint
            ]
            written[:] = [item.document.id for item in current]  # read by the store when the block ends
            if not current:
                return
            for item in current:
                index.delete(collection_id, item.document.id)  # rows of a job that ran before this one
            index.write(collection_id, [item.document for item in current], prepared)
        with self._condition:
            self.documents_built += len(current)

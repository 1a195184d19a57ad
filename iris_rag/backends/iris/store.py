"""The InterSystems IRIS store (RAG_STORE=iris): rows, VECTOR columns with an HNSW index, BM25 from postings.

As thin as the contract allows, and shaped like the PostgreSQL backend: the keyword leg is BM25 computed in
NumPy from the collection's own postings (iris_rag.backends.common.bm25, shared with Postgres) rather than an
iFind index, because the two cannot be compared on SciFact without a server and BM25 from the postings is
known to rank exactly as the SQLite store's FTS5 does. Exact vector search (NumPy over the collection's
stored float32 vectors, as in SQLite) answers small collections and filtered searches; past
EXACT_SEARCH_MAX_CHUNKS an HNSW index over the VECTOR column (VECTOR_COSINE) does. Metadata filters are
evaluated in Python on the decoded metadata (iris_rag.backends.iris.filters), with the Postgres backend's
semantics.

The driver is the official intersystems-irispython (DB-API, qmark parameters), imported only here. Written
from InterSystems' documentation; see the README for what has and has not run against a live server.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import orjson

from iris_rag.backends.common.bm25 import Postings, Totals, bm25_scores, query_stems, term_frequencies
from iris_rag.backends.common.call_log import CALL_COLUMNS, CALL_FIGURE_COLUMNS, covered_calls
from iris_rag.backends.common.technique_storage import TechniqueStorages
from iris_rag.backends.iris.filters import matches
from iris_rag.backends.iris.schema import (
    EXACT_COLLATION_STEP,
    MIGRATIONS,
    MIGRATIONS_TABLE_DDL,
    SCHEMA,
    VECTOR_EXACT_COLUMNS,
    collection_spelling,
    exact_collation,
    vector_table,
    vector_table_ddl,
)
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import DatabaseConnectionFailedError, TimeoutExceededError
from iris_rag.redaction import redact
from iris_rag.stores.base import (
    CacheItem,
    CacheOwner,
    CallFigures,
    CallFilter,
    CallRecord,
    CallTotals,
    CollectionInfo,
    DocumentInput,
    DocumentSummary,
    KeywordQuery,
    NewCollection,
    ScoredChunk,
    StoredChunk,
    StoredDocument,
    document_source,
    owner_columns,
)
from iris_rag.stores.filters import MetadataFilter
from iris_rag.stores.rows import written_dates
from iris_rag.stores.technique_index import CollectionState, TechniqueIndex
from iris_rag.stores.versioned import VersionedCache, logged_documents
from iris_rag.text import chunk_id

logger = logging.getLogger(__name__)
# Versions of change log kept per collection (the Changes table): a process further behind reloads whole.
CHANGE_LOG_VERSIONS = 10_000

T = TypeVar("T")

# Below this many chunks, or under a metadata filter, vector search is exact (as on Postgres).
EXACT_SEARCH_MAX_CHUNKS = 2_000
# Parameters per IN (...) list.
BATCH = 500
# Keyword terms longer than this (UTF-8 bytes) are neither indexed nor searched: a postings key is an index
# subscript, and a global reference holds at most 511 encoded bytes (collection id and row number included).
# The tokenizer leaves hex dumps and unpunctuated CJK runs whole; such a term never matches a query anyway.
MAX_TERM_BYTES = 200
# The driver's error text carries the SQLCODE: -110 and -114 are lock time-outs (LockTimeout, 10 s).
_LOCK_TIMEOUT_CODES = ("<-110>", "<-114>")


def _call_record(row: tuple[Any, ...]) -> CallRecord:
    return CallRecord(float(row[0]), row[1], row[2], float(row[3]), bool(row[4]), *row[5:9])


def _indexed(term: str) -> bool:
    """Whether the keyword index holds this term (see MAX_TERM_BYTES)."""
    return len(term.encode("utf-8")) <= MAX_TERM_BYTES


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _marks(count: int) -> str:
    """`?, ?, ...`: placeholders only, never values."""
    return ", ".join("?" * count)


def vector_literal(vector: npt.NDArray[np.float32]) -> str:
    """A vector as TO_VECTOR's text argument: each float32 in its shortest exact decimal form."""
    return ",".join(repr(float(v)) for v in np.asarray(vector, dtype=np.float32))


@dataclass(frozen=True, slots=True)
class IrisTarget:
    """Where the store connects: IRIS_HOST, IRIS_PORT, IRIS_NAMESPACE, IRIS_USERNAME, IRIS_PASSWORD."""

    host: str
    port: int = 1972
    namespace: str = "USER"
    username: str = "_SYSTEM"
    password: str = ""
    connect_timeout_s: float = 10.0

    def describe(self) -> str:
        """host:port/namespace as user, never the password."""
        return f"{self.username}@{self.host}:{self.port}/{self.namespace}"


class IrisConnectionError(DatabaseConnectionFailedError):
    """The IRIS server could not be reached or refused the login (the message names where, never how)."""


class IrisLockTimeoutError(TimeoutExceededError):
    """Another process held a lock this statement waited for past IRIS's lock time-out: retry."""


def connect(target: IrisTarget) -> Any:
    """A DB-API connection (autocommit off), or IrisConnectionError within the connect timeout."""
    # Reach the superserver port first, bounded: an unroutable host fails here in connect_timeout_s.
    try:
        with socket.create_connection((target.host, target.port), timeout=target.connect_timeout_s):
            pass
    except OSError as exc:
        msg = (
            f"cannot reach IRIS at {target.host}:{target.port} within {target.connect_timeout_s:g} s "
            f"({type(exc).__name__}: {exc}); check IRIS_HOST and IRIS_PORT, and that the server runs"
        )
        raise IrisConnectionError(redact(msg, [target.password])) from exc
    try:
        import iris  # intersystems-irispython: the iris extra
    except ImportError as exc:
        msg = "RAG_STORE=iris needs the InterSystems driver: pip install 'iris-rag[iris]'"
        raise IrisConnectionError(msg) from exc
    try:
        connection = iris.connect(
            hostname=target.host,
            port=target.port,
            namespace=target.namespace,
            username=target.username,
            password=target.password,
            timeout=max(1, round(target.connect_timeout_s)),
            sharedmemory=False,
            autoCommit=False,
        )
    except Exception as exc:
        msg = (
            f"IRIS at {target.describe()} refused the connection ({type(exc).__name__}: {exc}); "
            "check IRIS_NAMESPACE, IRIS_USERNAME and IRIS_PASSWORD"
        )
        raise IrisConnectionError(redact(msg, [target.password])) from exc
    # IRIS's default is READ UNCOMMITTED: a reader could cache the vectors and version of a write that is
    # then rolled back. The setting lasts for the connection's process (RSQL_settransaction).
    connection.cursor().execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED", [])
    return connection


@dataclass(frozen=True)
class _Vectors:
    """A collection's stored vectors as one matrix, reloaded when its data version moves on."""

    chunk_ids: list[str]
    document_ids: list[str]
    matrix: npt.NDArray[np.float32]
    row_of: dict[str, int]


class _ThreadState(threading.local):
    connection: Any = None
    depth: int = 0
    lost: bool = False  # the connection stopped answering: replaced at the next call outside a transaction


class IrisStore:
    """DocumentStore on InterSystems IRIS; RAG_STORE=iris with the IRIS_* settings."""

    backend_name = "iris"

    def __init__(self, target: IrisTarget) -> None:
        self._target = target
        self._local = _ThreadState()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._technique_indexes: list[TechniqueIndex] = []
        self._technique_storages: TechniqueStorages[IrisStore] = TechniqueStorages("iris")
        self._vectors: VersionedCache[_Vectors] = VersionedCache()
        self._vector_tables: set[int] = set()
        self._migrate()

    # Connections and transactions: one connection per thread, so a technique's storage joins the
    # thread's open transaction.
    def connection(self) -> Any:
        """The calling thread's connection (inside this backend only).

        One that stopped answering (the server restarted) is replaced here, outside a transaction: inside
        one it is kept, and the transaction fails with it.
        """
        if self._local.lost and not self._local.depth:
            self._forget(self._local.connection)
        if self._local.connection is None:
            self._local.connection = connect(self._target)
            with self._lock:
                self._all.append(self._local.connection)
        return self._local.connection

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One write transaction on the thread's connection; inside an open one, it joins it."""
        connection = self.connection()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield connection
            finally:
                self._local.depth -= 1
            return
        self._local.depth = 1
        try:
            yield connection
            with self._lost_says(connection):
                connection.commit()
        except BaseException:
            if not self._local.lost:  # a lost connection's server rolled it back already
                connection.rollback()
            raise
        finally:
            self._local.depth = 0

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> Any:
        """Run one statement on the thread's connection; the cursor (for its rows)."""
        connection = self.connection()
        cursor = connection.cursor()
        with self._lost_says(connection):
            cursor.execute(statement, list(parameters))
        return cursor

    def rows(self, statement: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of a query, as tuples; outside a transaction the read ends its own."""
        rows = [tuple(row) for row in self.execute(statement, parameters).fetchall()]
        if not self._local.depth:
            connection = self.connection()
            with self._lost_says(connection):
                connection.commit()
        return rows

    def executemany(self, statement: str, parameters: Sequence[Sequence[Any]]) -> None:
        """One statement over many parameter rows."""
        if parameters:
            connection = self.connection()
            with self._lost_says(connection):
                connection.cursor().executemany(statement, [list(p) for p in parameters])

    @contextmanager
    def _lost_says(self, connection: Any) -> Iterator[None]:
        """A failure of a connection that no longer answers a probe is IrisConnectionError (its cause kept).

        The driver's own errors do not tell a lost server from a bad statement; the probe does, and costs
        a round trip only after a failure. The thread's next call outside a transaction connects anew. A
        lock time-out is IrisLockTimeoutError (TIMEOUT_EXCEEDED: retry), not a bug's INTERNAL_ERROR.
        """
        try:
            yield
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
            if any(code in str(exc) for code in _LOCK_TIMEOUT_CODES):
                msg = (
                    f"IRIS lock time-out ({said}): another process held rows or a table this call needed "
                    "for longer than the server's LockTimeout (10 s by default); retry. An ingest batch "
                    "that writes past the SQL Lock Threshold locks whole tables (README, Stores)"
                )
                raise IrisLockTimeoutError(redact(msg, [self._target.password])) from exc
            if not self._local.lost:
                try:
                    connection.cursor().execute("SELECT 1", [])
                except Exception:
                    self._local.lost = True
            if self._local.lost:
                msg = f"the connection to IRIS at {self._target.describe()} was lost ({said})"
                raise IrisConnectionError(redact(msg, [self._target.password])) from exc
            raise

    def _forget(self, connection: Any) -> None:
        """Drop the thread's lost connection, closed as far as it still can be."""
        self._local.connection, self._local.lost = None, False
        with self._lock:
            if connection in self._all:
                self._all.remove(connection)
        try:
            connection.close()
        except Exception:  # gone with the server: nothing left to release
            logger.debug("lost IRIS connection already closed")

    def _table_exists(self, qualified: str) -> bool:
        schema, name = qualified.split(".")
        return bool(
            self.rows(
                "SELECT COUNT(*) FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (schema, name),
            )[0][0]
        )

    def _migrate(self) -> None:
        """Apply the schema's steps not yet recorded, in one transaction, under a table lock.

        An explicit LOCK outlives COMMIT (it holds until UNLOCK or the process ends: RSQL_lock), so it is
        released here; an UNLOCK without IMMEDIATE takes effect as the transaction ends, committed or rolled
        back (RSQL_unlock).
        """
        if not self._table_exists(f"{SCHEMA}.Migrations"):
            with self.transaction():
                self.execute(MIGRATIONS_TABLE_DDL)
        with self.transaction():
            self.execute(f"LOCK TABLE {SCHEMA}.Migrations IN EXCLUSIVE MODE")
            try:
                done = {int(row[0]) for row in self.rows(f"SELECT step FROM {SCHEMA}.Migrations")}
                for step, description, statements in MIGRATIONS:
                    if step in done:
                        continue
                    logger.info("IRIS schema step %d: %s", step, description)
                    for statement in self._with_vector_tables(step, statements):
                        self.execute(statement)
                    self.execute(
                        f"INSERT INTO {SCHEMA}.Migrations (step, description, applied_at) VALUES (?, ?, ?)",
                        (step, description, _now()),
                    )
            except BaseException:
                try:
                    self._unlock_migrations()
                except Exception:  # the step's own error is the one to raise: this one is only logged
                    logger.warning(
                        "could not unlock %s.Migrations after a failed schema step", SCHEMA, exc_info=True
                    )
                raise
            self._unlock_migrations()

    def _unlock_migrations(self) -> None:
        """Release the schema lock (or, in a transaction, as it ends)."""
        if not self._local.lost:  # a lost connection's process ended, and its locks with it
            self.execute(f"UNLOCK TABLE {SCHEMA}.Migrations IN EXCLUSIVE MODE")

    def _with_vector_tables(self, step: int, statements: list[str]) -> list[str]:
        """A step's statements, and for the EXACT collation step those of the vector tables there are.

        Every spelling is set before the Collections table's id turns EXACT, while both still compare as
        SQLUPPER.
        """
        if step != EXACT_COLLATION_STEP:
            return statements
        tables = [
            f"{SCHEMA}.{row[0]}"
            for row in self.rows(
                "SELECT TABLE_NAME FROM INFORMATION_SCHEMA.TABLES "
                "WHERE TABLE_SCHEMA = ? AND TABLE_NAME LIKE ?",
                (SCHEMA, "Vectors%"),
            )
        ]
        return [
            *(collection_spelling(table) for table in tables),
            *statements,
            *(s for table in tables for s in exact_collation(table, VECTOR_EXACT_COLUMNS)),
        ]

    def _ensure_vector_table(self, dimension: int) -> str:
        table = vector_table(dimension)
        if dimension not in self._vector_tables:
            if self._table_exists(table):
                self._vector_tables.add(dimension)
            else:  # remembered only once seen again: this transaction may yet roll the table back
                for statement in vector_table_ddl(dimension):
                    self.execute(statement)
        return table

    def register_index(self, index: TechniqueIndex) -> None:
        """Keep a technique's index in step with every later upsert and delete (in their transactions)."""
        with self._lock:
            self._technique_indexes.append(index)

    def technique_storage(self, contract: type[T]) -> T:
        """The IRIS implementation of a technique's storage contract, made once per store."""
        from iris_rag.backends.iris import TECHNIQUE_STORAGE  # the package imports this module

        return self._technique_storages.get(self, contract, TECHNIQUE_STORAGE)

    def ping(self) -> None:
        """Run a trivial query."""
        self.rows("SELECT 1")

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            for connection in self._all:
                try:
                    connection.close()
                except Exception:  # already gone with the server: nothing left to release
                    logger.debug("IRIS connection already closed")
            self._all.clear()
        self._local = _ThreadState()

    # Collections
    def _collection_rows(self, collection_id: str | None) -> list[CollectionInfo]:
        """One collection (or every one, for None) with its counts."""
        rows = self.rows(
            f"""SELECT c.id, c.embedding_model, c.dimension, c.description, c.created_at, c.updated_at,
                       c.chunk_total,
                       (SELECT COUNT(*) FROM {SCHEMA}.Documents d WHERE d.collection_id = c.id),
                       (SELECT v.data_version FROM {SCHEMA}.Versions v WHERE v.collection_id = c.id)
                FROM {SCHEMA}.Collections c WHERE (? IS NULL OR c.id = ?) ORDER BY c.id""",
            (collection_id, collection_id),
        )
        return [
            CollectionInfo(
                id=row[0],
                embedding_model=row[1],
                dimension=int(row[2]),
                description=row[3] or "",
                created_at=row[4],
                updated_at=row[5],
                chunk_count=int(row[6]),
                document_count=int(row[7]),
                version=int(row[8] or 0),
            )
            for row in rows
        ]

    def get_collection(self, collection_id: str) -> CollectionInfo | None:
        """The collection with counts, or None."""
        found = self._collection_rows(collection_id)
        return found[0] if found else None

    def create_collection(self, collection_id: str, embedding_model: str, dimension: int) -> CollectionInfo:
        """Create the collection if absent and return it."""
        with self.transaction():
            self._insert_collection(collection_id, embedding_model, dimension)
        info = self.get_collection(collection_id)
        assert info is not None
        return info

    def _insert_collection(self, collection_id: str, embedding_model: str, dimension: int) -> None:
        if self.rows(f"SELECT 1 FROM {SCHEMA}.Collections WHERE id = ?", (collection_id,)):
            return
        self._ensure_vector_table(dimension)
        now = _now()
        self.execute(
            f"""INSERT INTO {SCHEMA}.Collections (id, embedding_model, dimension, description, created_at,
                   updated_at, next_row, chunk_total, titled_chunks, title_tokens, content_tokens)
                VALUES (?, ?, ?, '', ?, ?, 1, 0, 0, 0, 0)""",
            (collection_id, embedding_model, int(dimension), now, now),
        )

    def list_collections(self) -> list[CollectionInfo]:
        """Every collection with counts."""
        return self._collection_rows(None)

    def set_description(self, collection_id: str, description: str) -> CollectionInfo | None:
        """Set the collection's description; None if there is no such collection."""
        # No rowcount: the driver's is not reliable (sqlalchemy-iris: supports_sane_rowcount False).
        with self.transaction():
            self.execute(
                f"UPDATE {SCHEMA}.Collections SET description = ?, updated_at = ? WHERE id = ?",
                (description, _now(), collection_id),
            )
        return self.get_collection(collection_id)

    # Documents
    def _lock_collection(self, collection_id: str) -> tuple[int, int] | None:
        """Lock the collection row for this transaction; (dimension, next row), or None if absent.

        Writers of one collection go one at a time: they share its counters.
        """
        self.execute(f"UPDATE {SCHEMA}.Collections SET updated_at = ? WHERE id = ?", (_now(), collection_id))
        rows = self.rows(
            f"SELECT dimension, next_row FROM {SCHEMA}.Collections WHERE id = ?", (collection_id,)
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def _bump_version(self, collection_id: str, document_ids: Iterable[str]) -> None:
        """Move the data version on and log the documents it changed, in the write's transaction.

        The last CHANGE_LOG_VERSIONS versions' rows are kept (pruned every 1,000 versions).
        """
        if self.rows(f"SELECT 1 FROM {SCHEMA}.Versions WHERE collection_id = ?", (collection_id,)):
            self.execute(
                f"UPDATE {SCHEMA}.Versions SET data_version = data_version + 1 WHERE collection_id = ?",
                (collection_id,),
            )
        else:
            self.execute(
                f"INSERT INTO {SCHEMA}.Versions (collection_id, data_version) VALUES (?, 1)", (collection_id,)
            )
        version = self.data_version(collection_id)
        self.executemany(
            f"INSERT INTO {SCHEMA}.Changes (collection_id, data_version, document_id) VALUES (?, ?, ?)",
            [(collection_id, version, document_id) for document_id in sorted(set(document_ids))],
        )
        if version % 1000 == 0:
            self.execute(
                f"DELETE FROM {SCHEMA}.Changes WHERE collection_id = ? AND data_version <= ?",
                (collection_id, version - CHANGE_LOG_VERSIONS),
            )

    def upsert_documents(
        self,
        collection_id: str,
        documents: list[DocumentInput],
        prepared: dict[str, Any] | None = None,
        *,
        new_collection: NewCollection | None = None,
    ) -> int:
        """Insert or replace documents, chunks, vectors, postings and technique rows in one transaction."""
        now = _now()
        written = 0
        with self.transaction():
            if new_collection is not None:
                self._insert_collection(
                    collection_id, new_collection.embedding_model, new_collection.dimension
                )
            locked = self._lock_collection(collection_id)
            if locked is None:
                msg = f"collection {collection_id!r} does not exist"
                raise ValueError(msg)
            dimension, next_row = locked
            for document in documents:
                created_at, updated_at = written_dates(
                    self.get_document(collection_id, document.id), document, now
                )
                self._delete_document_rows(collection_id, document.id, dimension, replaced_by=document)
                self.execute(
                    f"""INSERT INTO {SCHEMA}.Documents (collection_id, doc_id, doc_order, doc_title,
                           doc_content,
                           doc_chars, chunk_total, meta_json, created_at, updated_at)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    (
                        collection_id,
                        document.id,
                        next_row,
                        document.title,
                        document.content,
                        len(document.content),
                        len(document.chunks),
                        orjson.dumps(document.metadata).decode(),
                        created_at,
                        updated_at,
                    ),
                )
                next_row = self._insert_chunks(collection_id, document, dimension, next_row + 1)
                written += len(document.chunks)
            self.execute(
                f"UPDATE {SCHEMA}.Collections SET next_row = ?, updated_at = ? WHERE id = ?",
                (next_row, now, collection_id),
            )
            for index in self._technique_indexes:
                if prepared is not None and index.name in prepared:
                    index.write(collection_id, documents, prepared[index.name])
            if documents:
                self._bump_version(collection_id, [document.id for document in documents])
            check_cancelled()
        self._vectors.discard(collection_id)
        return written

    def _insert_chunks(self, collection_id: str, document: DocumentInput, dimension: int, row: int) -> int:
        """The document's chunks, vectors and postings from chunk row `row`; the next free row."""
        (title_terms, title_length), *contents = term_frequencies(
            [document.title, *(chunk.content for chunk in document.chunks)]
        )
        titled = bool(document.title.strip())
        chunks: list[Sequence[Any]] = []
        vectors: list[Sequence[Any]] = []
        postings: list[Sequence[Any]] = []
        totals = [0, 0, 0, 0]
        for chunk, (content_terms, content_length) in zip(document.chunks, contents, strict=True):
            identifier = chunk_id(document.id, chunk.index)
            vector = np.ascontiguousarray(chunk.vector, dtype=np.float32)
            if vector.shape != (dimension,):
                msg = f"chunk {identifier!r} has {vector.size} dimensions; the collection has {dimension}"
                raise ValueError(msg)
            chunks.append(
                (
                    collection_id,
                    row,
                    identifier,
                    document.id,
                    chunk.index,
                    chunk.content,
                    chunk.start_char,
                    chunk.end_char,
                    title_length,
                    content_length,
                    int(titled),
                )
            )
            vectors.append(
                (collection_id, row, identifier, document.id, vector.tobytes(), vector_literal(vector))
            )
            postings += [
                (collection_id, t, row, title_terms[t], content_terms[t], title_length, content_length)
                for t in sorted(title_terms.keys() | content_terms.keys())
                if _indexed(t)
            ]
            totals = [
                totals[0] + 1,
                totals[1] + int(titled),
                totals[2] + title_length,
                totals[3] + content_length,
            ]
            row += 1
        self.executemany(
            f"""INSERT INTO {SCHEMA}.Chunks (collection_id, chunk_row, chunk_id, document_id, chunk_index,
                   chunk_text, start_char, end_char, title_length, content_length, titled)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            chunks,
        )
        self.executemany(
            f"""INSERT INTO {vector_table(dimension)} (collection_id, chunk_row, chunk_id, document_id,
                   raw_vector, embedding) VALUES (?, ?, ?, ?, ?, TO_VECTOR(?, FLOAT, {int(dimension)}))""",
            vectors,
        )
        self.executemany(
            f"""INSERT INTO {SCHEMA}.Postings (collection_id, term, chunk_row, title_tf, content_tf,
                   title_length, content_length) VALUES (?, ?, ?, ?, ?, ?, ?)""",
            postings,
        )
        self._add_totals(collection_id, totals)
        return row

    def _add_totals(self, collection_id: str, totals: list[int]) -> None:
        self.execute(
            f"""UPDATE {SCHEMA}.Collections SET chunk_total = chunk_total + ?,
                   titled_chunks = titled_chunks + ?,
                   title_tokens = title_tokens + ?, content_tokens = content_tokens + ? WHERE id = ?""",
            (*totals, collection_id),
        )

    def _delete_document_rows(
        self,
        collection_id: str,
        document_id: str,
        dimension: int,
        *,
        replaced_by: DocumentInput | None = None,
    ) -> int:
        """The document's rows everywhere; its cached vectors too, but for those of `replaced_by`'s text."""
        for index in self._technique_indexes:
            index.delete(collection_id, document_id)
        if replaced_by is None:
            self.execute(
                f"DELETE FROM {SCHEMA}.EmbeddingCache WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )
        else:
            self.execute(
                f"DELETE FROM {SCHEMA}.EmbeddingCache "
                "WHERE collection_id = ? AND document_id = ? AND source_hash <> ?",
                (collection_id, document_id, document_source(replaced_by.title, replaced_by.content)),
            )
        removed = self.rows(
            f"""SELECT chunk_row, titled, title_length, content_length FROM {SCHEMA}.Chunks
                WHERE collection_id = ? AND document_id = ?""",
            (collection_id, document_id),
        )
        if removed:
            rows = [int(r[0]) for r in removed]
            for start in range(0, len(rows), BATCH):
                batch = rows[start : start + BATCH]
                self.execute(
                    f"DELETE FROM {SCHEMA}.Postings WHERE collection_id = ? "
                    f"AND chunk_row IN ({_marks(len(batch))})",
                    (collection_id, *batch),
                )
            self.execute(
                f"DELETE FROM {vector_table(dimension)} WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )
            self.execute(
                f"DELETE FROM {SCHEMA}.Chunks WHERE collection_id = ? AND document_id = ?",
                (collection_id, document_id),
            )
            self._add_totals(
                collection_id,
                [
                    -len(removed),
                    -sum(int(r[1]) for r in removed),
                    -sum(int(r[2]) for r in removed),
                    -sum(int(r[3]) for r in removed),
                ],
            )
        present = self.rows(
            f"SELECT 1 FROM {SCHEMA}.Documents WHERE collection_id = ? AND doc_id = ?",
            (collection_id, document_id),
        )
        if present:
            self.execute(
                f"DELETE FROM {SCHEMA}.Documents WHERE collection_id = ? AND doc_id = ?",
                (collection_id, document_id),
            )
        return len(present)

    def delete_document(self, collection_id: str, document_id: str) -> bool:
        """Delete a document and its chunks; False if it was absent."""
        with self.transaction():
            locked = self._lock_collection(collection_id)
            if locked is None:
                return False
            deleted = self._delete_document_rows(collection_id, document_id, locked[0])
            if deleted:
                self._bump_version(collection_id, [document_id])
        self._vectors.discard(collection_id)
        return deleted > 0

    @contextmanager
    def collection_transaction(self, collection_id: str) -> Iterator[None]:
        """A transaction serialized with the collection's writers by the lock of its row."""
        with self.transaction():
            self._lock_collection(collection_id)
            yield

    @contextmanager
    def index_transaction(self, collection_id: str, document_ids: list[str]) -> Iterator[None]:
        """A transaction for technique rows built after the documents' commit.

        Serialized with the collection's writers (collection_transaction); the data version moves on
        when rows were written.
        """
        with self.collection_transaction(collection_id):
            yield
            if document_ids:
                self._bump_version(collection_id, document_ids)

    def delete_collection(self, collection_id: str) -> int | None:
        """Each document through the technique indexes, then every row of the collection."""
        with self.transaction():
            locked = self._lock_collection(collection_id)
            if locked is None:
                return None
            document_ids = self.document_ids(collection_id)
            for document_id in document_ids:
                check_cancelled()
                for index in self._technique_indexes:
                    index.delete(collection_id, document_id)
            for index in self._technique_indexes:
                if isinstance(index, CollectionState):
                    index.drop_collection(collection_id)
            for table in (f"{SCHEMA}.Postings", vector_table(locked[0]), f"{SCHEMA}.Chunks"):
                self.execute(f"DELETE FROM {table} WHERE collection_id = ?", (collection_id,))
            self.execute(f"DELETE FROM {SCHEMA}.Documents WHERE collection_id = ?", (collection_id,))
            self.execute(f"DELETE FROM {SCHEMA}.EmbeddingCache WHERE collection_id = ?", (collection_id,))
            self.execute(f"DELETE FROM {SCHEMA}.Collections WHERE id = ?", (collection_id,))
            if document_ids:
                self._bump_version(collection_id, document_ids)
            # Its version stays (versions never repeat); its log goes, so any older cached state reloads.
            self.execute(f"DELETE FROM {SCHEMA}.Changes WHERE collection_id = ?", (collection_id,))
        self._vectors.discard(collection_id)
        return len(document_ids)

    def get_document(self, collection_id: str, document_id: str) -> StoredDocument | None:
        """One document, or None."""
        rows = self.rows(
            f"""SELECT doc_id, collection_id, doc_title, doc_content, meta_json, created_at, updated_at
                FROM {SCHEMA}.Documents WHERE collection_id = ? AND doc_id = ?""",
            (collection_id, document_id),
        )
        if not rows:
            return None
        row = rows[0]
        return StoredDocument(row[0], row[1], row[2], row[3], orjson.loads(row[4]), row[5], row[6])

    def document_ids(self, collection_id: str) -> list[str]:
        """Every document id of the collection, in insertion order."""
        rows = self.rows(
            f"SELECT doc_id FROM {SCHEMA}.Documents WHERE collection_id = ? ORDER BY doc_order",
            (collection_id,),
        )
        return [row[0] for row in rows]

    def list_documents(self, collection_id: str, offset: int, limit: int) -> list[DocumentSummary]:
        """A page of the collection's documents, in insertion order (TOP reads offset + limit rows)."""
        rows = self.rows(
            f"""SELECT TOP {int(offset) + int(limit)} doc_id, doc_title, doc_chars, chunk_total, created_at,
                       updated_at
                FROM {SCHEMA}.Documents WHERE collection_id = ? ORDER BY doc_order""",
            (collection_id,),
        )[int(offset) :]
        return [DocumentSummary(r[0], r[1], int(r[2]), int(r[3]), r[4], r[5]) for r in rows]

    _CHUNK_SELECT = f"""SELECT k.chunk_id, k.document_id, k.chunk_index, k.chunk_text, k.start_char,
                              k.end_char,
                              d.doc_title, d.meta_json
                       FROM {SCHEMA}.Chunks k JOIN {SCHEMA}.Documents d
                         ON d.collection_id = k.collection_id AND d.doc_id = k.document_id"""

    @staticmethod
    def _chunk(row: tuple[Any, ...]) -> StoredChunk:
        return StoredChunk(
            row[0], row[1], int(row[2]), row[3], int(row[4]), int(row[5]), row[6], orjson.loads(row[7])
        )

    def get_document_chunks(self, collection_id: str, document_id: str) -> list[StoredChunk]:
        """A document's chunks in order."""
        rows = self.rows(
            f"{self._CHUNK_SELECT} WHERE k.collection_id = ? AND k.document_id = ? ORDER BY k.chunk_index",
            (collection_id, document_id),
        )
        return [self._chunk(row) for row in rows]

    def get_chunks(self, collection_id: str, chunk_ids: list[str]) -> list[StoredChunk]:
        """Chunks by id, in the order asked (unknown ids are skipped)."""
        by_id: dict[str, StoredChunk] = {}
        unique = list(dict.fromkeys(chunk_ids))
        for start in range(0, len(unique), BATCH):
            batch = unique[start : start + BATCH]
            for row in self.rows(
                f"{self._CHUNK_SELECT} WHERE k.collection_id = ? AND k.chunk_id IN ({_marks(len(batch))})",
                (collection_id, *batch),
            ):
                by_id[row[0]] = self._chunk(row)
        return [by_id[c] for c in chunk_ids if c in by_id]

    # Search
    def data_version(self, collection_id: str) -> int:
        """The collection's data version: any process's write or delete of its documents moves it on."""
        rows = self.rows(
            f"SELECT data_version FROM {SCHEMA}.Versions WHERE collection_id = ?", (collection_id,)
        )
        return int(rows[0][0]) if rows else 0

    def changed_documents(self, collection_id: str, since: int, through: int, limit: int) -> set[str] | None:
        """From the Changes table, which every version bump writes (None: a gap, or over `limit`)."""
        rows = self.rows(
            f"SELECT data_version, document_id FROM {SCHEMA}.Changes "
            "WHERE collection_id = ? AND data_version > ?",
            (collection_id, since),
        )
        return logged_documents(((int(row[0]), row[1]) for row in rows), since, through, limit)

    def read_snapshot(self) -> AbstractContextManager[None]:
        """No snapshot: each query reads the committed rows (rag_noderag reads its leaves in one query)."""
        return nullcontext()

    def _collection_vectors(self, collection_id: str) -> _Vectors:
        return self._vectors.get(
            collection_id, self.data_version(collection_id), lambda: self._load_vectors(collection_id)
        )

    def _load_vectors(self, collection_id: str) -> _Vectors:
        info = self.rows(f"SELECT dimension FROM {SCHEMA}.Collections WHERE id = ?", (collection_id,))
        rows = (
            self.rows(
                f"SELECT chunk_id, document_id, raw_vector FROM {vector_table(int(info[0][0]))} "
                "WHERE collection_id = ? ORDER BY chunk_row",
                (collection_id,),
            )
            if info
            else []
        )
        if rows:
            matrix = np.frombuffer(b"".join(bytes(row[2]) for row in rows), dtype=np.float32)
            matrix = matrix.reshape(len(rows), -1)
        else:
            matrix = np.zeros((0, 0), dtype=np.float32)
        ids = [row[0] for row in rows]
        return _Vectors(ids, [row[1] for row in rows], matrix, {c: i for i, c in enumerate(ids)})

    def vector_search(
        self,
        collection_id: str,
        query_vector: npt.NDArray[np.float32],
        top_k: int,
        metadata_filter: MetadataFilter | None = None,
    ) -> list[ScoredChunk]:
        """Cosine top_k: exact on small collections or under a filter, else through the HNSW index."""
        info = self.rows(
            f"SELECT dimension, chunk_total FROM {SCHEMA}.Collections WHERE id = ?", (collection_id,)
        )
        if not info or top_k <= 0:
            return []
        dimension, chunks = int(info[0][0]), int(info[0][1])
        query = np.asarray(query_vector, dtype=np.float32)
        if metadata_filter is None and chunks > EXACT_SEARCH_MAX_CHUNKS:
            expression = f"VECTOR_COSINE(embedding, TO_VECTOR(?, FLOAT, {int(dimension)}))"
            literal = vector_literal(query)
            rows = self.rows(
                f"SELECT TOP {int(top_k)} chunk_id, {expression} FROM {vector_table(dimension)} "
                f"WHERE collection_id = ? ORDER BY {expression} DESC",
                (literal, collection_id, literal),
            )
            # The index is over every collection of this dimension: if the collection filter left it
            # short of top_k, the exact search answers instead.
            if len(rows) >= min(top_k, chunks):
                return [ScoredChunk(row[0], float(row[1])) for row in rows]
        vectors = self._collection_vectors(collection_id)
        if not vectors.chunk_ids:
            return []
        scores = vectors.matrix @ query
        if metadata_filter is not None:
            allowed = self.matching_document_ids(collection_id, metadata_filter)
            mask = np.fromiter((d in allowed for d in vectors.document_ids), dtype=bool, count=len(scores))
            scores = np.where(mask, scores, -np.inf).astype(np.float32)
            top_k = min(top_k, int(mask.sum()))
        if top_k <= 0:
            return []
        order = np.lexsort((np.arange(len(scores)), -scores))[:top_k]
        return [ScoredChunk(vectors.chunk_ids[i], float(scores[i])) for i in order]

    def vector_scores(
        self, collection_id: str, query_vector: npt.NDArray[np.float32], chunk_ids: list[str]
    ) -> dict[str, float]:
        """Exact cosine similarity of the given chunks (unknown ids are left out)."""
        vectors = self._collection_vectors(collection_id)
        rows = [vectors.row_of[c] for c in chunk_ids if c in vectors.row_of]
        if not rows:
            return {}
        scores = vectors.matrix[rows] @ np.asarray(query_vector, dtype=np.float32)
        return {vectors.chunk_ids[r]: float(s) for r, s in zip(rows, scores, strict=True)}

    def chunk_vectors(self, collection_id: str, chunk_ids: list[str]) -> dict[str, npt.NDArray[np.float32]]:
        """The stored vectors of the given chunks (unknown ids are left out)."""
        vectors = self._collection_vectors(collection_id)
        return {c: vectors.matrix[vectors.row_of[c]].copy() for c in chunk_ids if c in vectors.row_of}

    def keyword_search(
        self,
        collection_id: str,
        query: KeywordQuery,
        top_k: int,
        metadata_filter: MetadataFilter | None = None,
    ) -> list[ScoredChunk]:
        """BM25 (k1 1.2, b 0.75) from the collection's own statistics, exactly as on Postgres (bm25.py)."""
        stems = {t: weight for t, weight in query_stems(query.terms).items() if _indexed(t)}
        if not stems or top_k <= 0:
            return []
        totals_rows = self.rows(
            f"SELECT chunk_total, titled_chunks, title_tokens, content_tokens FROM {SCHEMA}.Collections "
            "WHERE id = ?",
            (collection_id,),
        )
        if not totals_rows:
            return []
        terms = list(stems)
        found: list[tuple[Any, ...]] = []
        for start in range(0, len(terms), BATCH):
            batch = terms[start : start + BATCH]
            found += self.rows(
                f"""SELECT term, chunk_row, title_tf, content_tf, title_length, content_length
                    FROM {SCHEMA}.Postings WHERE collection_id = ? AND term IN ({_marks(len(batch))})""",
                (collection_id, *batch),
            )
        if not found:
            return []
        index = {term: i for i, term in enumerate(terms)}
        columns = np.asarray([row[1:] for row in found], dtype=np.int64)
        postings = Postings(
            term=np.asarray([index[row[0]] for row in found], dtype=np.int64),
            chunk_row=columns[:, 0],
            title_tf=columns[:, 1].astype(np.float64),
            content_tf=columns[:, 2].astype(np.float64),
            title_length=columns[:, 3].astype(np.float64),
            content_length=columns[:, 4].astype(np.float64),
        )
        total = totals_rows[0]
        chunk_rows, scores = bm25_scores(
            postings,
            np.asarray(list(stems.values()), dtype=np.float64),
            Totals(int(total[0]), int(total[1]), int(total[2]), int(total[3])),
            query.scoring,
            float(query.title_weight),
        )
        ids = self._chunk_ids_of_rows(collection_id, [int(r) for r in chunk_rows])
        if metadata_filter is not None:
            allowed = self.matching_document_ids(collection_id, metadata_filter)
            keep = np.fromiter(
                (ids.get(int(r), ("", ""))[1] in allowed for r in chunk_rows),
                dtype=bool,
                count=len(chunk_rows),
            )
            chunk_rows, scores = chunk_rows[keep], scores[keep]
        order = np.lexsort((chunk_rows, -scores))[:top_k]
        return [
            ScoredChunk(ids[int(row)][0], float(score))
            for row, score in zip(chunk_rows[order], scores[order], strict=True)
            if int(row) in ids
        ]

    def _chunk_ids_of_rows(self, collection_id: str, rows: list[int]) -> dict[int, tuple[str, str]]:
        """Chunk row -> (chunk id, document id)."""
        found: dict[int, tuple[str, str]] = {}
        for start in range(0, len(rows), BATCH):
            batch = rows[start : start + BATCH]
            for row in self.rows(
                f"SELECT chunk_row, chunk_id, document_id FROM {SCHEMA}.Chunks "
                f"WHERE collection_id = ? AND chunk_row IN ({_marks(len(batch))})",
                (collection_id, *batch),
            ):
                found[int(row[0])] = (row[1], row[2])
        return found

    def term_document_counts(self, collection_id: str) -> dict[str, int]:
        """Every (stemmed) term of the collection's keyword index with the number of chunks holding it."""
        rows = self.rows(
            f"SELECT term, COUNT(*) FROM {SCHEMA}.Postings WHERE collection_id = ? GROUP BY term",
            (collection_id,),
        )
        return {row[0]: int(row[1]) for row in rows}

    def _metadata(self, collection_id: str) -> list[tuple[str, dict[str, Any]]]:
        rows = self.rows(
            f"SELECT doc_id, meta_json FROM {SCHEMA}.Documents WHERE collection_id = ?", (collection_id,)
        )
        return [(row[0], orjson.loads(row[1])) for row in rows]

    def matching_document_ids(self, collection_id: str, metadata_filter: MetadataFilter) -> set[str]:
        """Ids of the collection's documents whose metadata passes the filter."""
        return {d for d, metadata in self._metadata(collection_id) if matches(metadata, metadata_filter)}

    def unknown_fields(self, collection_id: str, fields: list[str]) -> list[str]:
        """The fields that no document of the collection has in its metadata."""
        seen: set[str] = set()
        for _, metadata in self._metadata(collection_id):
            seen.update(metadata)
        return [field for field in fields if field not in seen]

    def chunk_count(self, collection_id: str) -> int:
        """How many chunks a search over the collection considers."""
        rows = self.rows(f"SELECT chunk_total FROM {SCHEMA}.Collections WHERE id = ?", (collection_id,))
        return int(rows[0][0]) if rows else 0

    # Embedding cache
    def cached_embeddings(self, model: str, text_hashes: list[bytes]) -> dict[bytes, npt.NDArray[np.float32]]:
        """The cached vectors among the given text hashes."""
        found: dict[bytes, npt.NDArray[np.float32]] = {}
        for start in range(0, len(text_hashes), BATCH):
            batch = text_hashes[start : start + BATCH]
            for row in self.rows(
                f"SELECT text_hash, raw_vector FROM {SCHEMA}.EmbeddingCache "
                f"WHERE model_name = ? AND text_hash IN ({_marks(len(batch))})",
                (model, *batch),
            ):
                found[bytes(row[0])] = np.frombuffer(bytes(row[1]), dtype=np.float32)
        return found

    def cache_embeddings(self, model: str, items: list[CacheItem]) -> None:
        """Remember vectors by text hash, each owned by the document it was made for.

        A hash cached again takes the latest vector and keeps its first owner, as SQLite's and PostgreSQL's
        ON CONFLICT DO UPDATE SET vector do (IRIS's INSERT OR UPDATE would replace the owner too).
        """
        if not items:
            return
        vectors = {h: np.ascontiguousarray(v, dtype=np.float32).tobytes() for h, v, _ in items}
        owners: dict[bytes, CacheOwner | None] = {}
        for h, _, owner in items:
            owners.setdefault(h, owner)
        with self.transaction():
            known = self.cached_embeddings(model, list(vectors))
            self.executemany(
                f"UPDATE {SCHEMA}.EmbeddingCache SET raw_vector = ? WHERE model_name = ? AND text_hash = ?",
                [(vector, model, h) for h, vector in vectors.items() if h in known],
            )
            self.executemany(
                f"""INSERT INTO {SCHEMA}.EmbeddingCache (model_name, text_hash, raw_vector, collection_id,
                       document_id, source_hash) VALUES (?, ?, ?, ?, ?, ?)""",
                [
                    (model, h, vector, *owner_columns(owners[h]))
                    for h, vector in vectors.items()
                    if h not in known
                ],
            )

    # Monitoring
    def record_call(self, record: CallRecord) -> None:
        """Append one call record."""
        with self.transaction():
            self.execute(
                f"INSERT INTO {SCHEMA}.Calls ({CALL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.timestamp,
                    record.tool,
                    record.technique,
                    record.duration_ms,
                    int(record.success),
                    record.error_code,
                    record.principal,
                    record.request_id,
                    record.session_id,
                ),
            )

    def calls_since(self, since: float) -> list[CallRecord]:
        """Every call record at or after a UNIX time."""
        rows = self.rows(f"SELECT {CALL_COLUMNS} FROM {SCHEMA}.Calls WHERE ts >= ? ORDER BY ts", (since,))
        return [_call_record(row) for row in rows]

    def call_totals(self, which: CallFilter, before: float | None = None) -> CallTotals:
        """Count, successes and durations' sum of the records a filter covers (and before a UNIX time)."""
        expression, parameters = covered_calls(which, before, mark="?")
        row = self.rows(
            f"SELECT COUNT(*), SUM(success), SUM(duration_ms) FROM {SCHEMA}.Calls WHERE {expression}",
            parameters,
        )[0]
        return CallTotals(int(row[0]), int(row[1] or 0), float(row[2] or 0.0))

    def call_figures(self, which: CallFilter) -> list[CallFigures]:
        """The figures of the call records a filter covers, in time order."""
        expression, parameters = covered_calls(which, mark="?")
        rows = self.rows(
            f"SELECT {CALL_FIGURE_COLUMNS} FROM {SCHEMA}.Calls WHERE {expression} ORDER BY ts",
            parameters,
        )
        return [(float(r[0]), r[1], r[2], float(r[3]), int(r[4]), r[5], r[6]) for r in rows]

    def recent_calls(self, which: CallFilter, limit: int) -> list[CallRecord]:
        """The latest call records a filter covers, newest first."""
        expression, parameters = covered_calls(which, mark="?")
        rows = self.rows(
            f"SELECT TOP {int(limit)} {CALL_COLUMNS} FROM {SCHEMA}.Calls WHERE {expression} ORDER BY ts DESC",
            parameters,
        )
        return [_call_record(row) for row in rows]

    def forget_calls_before(self, before: float) -> None:
        """Delete every call record before a UNIX time."""
        with self.transaction():
            self.execute(f"DELETE FROM {SCHEMA}.Calls WHERE ts < ?", (before,))

    def stats(self) -> dict[str, Any]:
        """Sizes and counts for health details (where, never the password)."""
        counts = self.rows(
            f"""SELECT (SELECT COUNT(*) FROM {SCHEMA}.Collections), (SELECT COUNT(*) FROM {SCHEMA}.Documents),
                       (SELECT COUNT(*) FROM {SCHEMA}.Chunks)"""
        )[0]
        return {
            "backend": self.backend_name,
            "server": self._target.describe(),
            "collections": int(counts[0]),
            "documents": int(counts[1]),
            "chunks": int(counts[2]),
            "connections": len(self._all),
            "technique_indexes": {index.name: index.stats() for index in self._technique_indexes},
        }

"""The PostgreSQL store: rows, pgvector vectors (HNSW per collection) and a BM25 keyword index in SQL."""

from __future__ import annotations

import logging
import secrets
import select
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import orjson
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector
from psycopg import Connection, OperationalError, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import ConnectionPool

from iris_rag.backends.common.bm25 import (
    PartialParts,
    Postings,
    TermCounts,
    Totals,
    bm25_bounds,
    bm25_parts,
    bm25_scores,
    combine_parts,
    query_stems,
    term_frequencies,
)
from iris_rag.backends.common.call_log import CALL_COLUMNS, CALL_FIGURE_COLUMNS, covered_calls
from iris_rag.backends.common.technique_storage import TechniqueStorages
from iris_rag.backends.postgres import keyword_blocks
from iris_rag.backends.postgres.filters import to_sql
from iris_rag.backends.postgres.keyword_blocks import (
    BLOCK_STARTS_SQL,
    BLOCKS_SQL,
    POSTINGS_SQL,
    Posting,
)
from iris_rag.backends.postgres.migrations import migrate
from iris_rag.cancellation import check_cancelled
from iris_rag.redaction import redact, url_userinfo, with_pieces
from iris_rag.stores.base import (
    CacheItem,
    CallFigures,
    CallFilter,
    CallRecord,
    CallTotals,
    ChunkInput,
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
from iris_rag.stores.rows import (
    call_record,
    collection_info,
    document_summary,
    stored_chunk,
    stored_document,
    written_dates,
)
from iris_rag.stores.technique_index import CollectionState, TechniqueIndex
from iris_rag.stores.versioned import logged_documents
from iris_rag.text import chunk_id

logger = logging.getLogger(__name__)

T = TypeVar("T")
Row = dict[str, Any]

# Below this many chunks, or under a metadata filter, search is exact (like the SQLite store). Above it the
# HNSW index answers: over SciFact's 10,299 chunks an exact scan took 37 ms at the median and the index
# 1.5 ms (bench/bench_backends.py), with the same nDCG@10 at the ef_search below (100 candidates kept
# recall@10 at 0.84 on uniform random vectors, the contract suite's hardest fixture; 200 kept it at 0.946-0.96
# from one build to the next with pgvector's default ef_construction of 64, so new indexes are built with 128:
# a better graph costs ingest time, not query time; an ef_search above 200 tripled rag_basic's p50).
EXACT_SEARCH_MAX_CHUNKS = 2_000
# Candidates the HNSW search keeps (pgvector's default is 40): at least this many, 2 x top_k, and one per
# CHUNKS_PER_CANDIDATE chunks of the collection, up to pgvector's most (1,000). A fixed 200 held recall@10
# at 0.99 over 100K chunks but let it fall to 0.945 at 500K and 0.85 at 1M (bench_scale's clustered
# vectors); 1,000 at 1M gives 0.971 for 5 ms more a search (docs/benchmarks.md).
MIN_EF_SEARCH = 200
CHUNKS_PER_CANDIDATE = 1_000
MAX_EF_SEARCH = 1_000
# An upsert of at least this many chunks (or any upsert inside bulk_load()) writes its documents, chunks and
# keyword postings by binary COPY, a few statements per batch, instead of an INSERT per row.
BULK_MIN_CHUNKS = 500
# The HNSW build's memory (maintenance_work_mem): about this many bytes per chunk beyond its vector, so the
# whole graph fits (pgvector builds far slower once it does not), within these bounds in MiB.
HNSW_BUILD_BYTES_PER_CHUNK = 1024
HNSW_BUILD_MEMORY_MB = (64, 8192)
# Parallel workers the HNSW build may use (the server caps them with max_parallel_workers and by table size).
HNSW_BUILD_WORKERS = 4
# A keyword query whose terms have more postings than this in all is ranked by MaxScore: the postings of its
# rarer terms are read whole, those of its frequent terms only for the chunks that can still reach the top
# (keyword_terms' counts give the IDF and each term's bound). Below it every posting is read, as before.
PRUNE_MIN_POSTINGS = 20_000
# What reading one block by its key costs, in blocks read as part of a term's run. MaxScore reads only the
# frequent terms' blocks that hold its remaining chunks where that costs less than reading those terms whole.
BLOCK_LOOKUP_COST = 2
# How long a call waits for a connection from the pool, and how long the pool's background attempts to reach
# the server go on before a new call starts them again. A server that is up gives one in milliseconds;
# one that is down (a restart) gives each call DATABASE_CONNECTION_FAILED after this wait, and calls
# reconnect within about this long after it is back (psycopg_pool's 30 s and 5 min delayed both).
POOL_WAIT_S = 5.0


def ef_search(top_k: int, chunks: int) -> int:
    """hnsw.ef_search for a search of top_k over a collection of this many chunks."""
    return max(MIN_EF_SEARCH, min(MAX_EF_SEARCH, max(2 * top_k, chunks // CHUNKS_PER_CANDIDATE)))


def database_identity(url: str) -> tuple[str, str, str]:
    """(host, port, database) of a PostgreSQL URL, libpq's defaults filled in; the URL as is if unparsable.

    Two URLs with the same identity name one database, whoever logs in (migrate's same-store check).
    """
    try:
        found = conninfo_to_dict(url)
    except psycopg.Error:  # a URL libpq cannot read: only an identical spelling is the same
        return (url, "", "")
    host = str(found.get("host") or "").lower()
    port = str(found.get("port") or "5432")
    return host, port, str(found.get("dbname") or found.get("user") or "")


def _check_idle(connection: Connection[Row]) -> None:
    """Raise unless an idle connection still works: the pool's check, and each thread's before a call.

    A server says something unasked only as it ends a connection (a restart, pg_terminate_backend,
    idle_session_timeout), so only a socket with input to read costs a round trip.
    """
    if connection.closed:
        msg = "the connection is closed"
        raise OperationalError(msg)
    if _has_input(connection.pgconn.socket):
        connection.execute("")


def _has_input(socket: int) -> bool:
    if not hasattr(select, "poll"):  # Windows, whose select() takes any socket
        return bool(select.select([socket], [], [], 0)[0])
    poller = select.poll()  # not select(): no limit on the descriptor's number
    poller.register(socket, select.POLLIN)
    return bool(poller.poll(0))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _hnsw_index_name(collection_id: str) -> str:
    # Hex of the id: any id gives a valid, distinct identifier (63 bytes max, so long ids are cut).
    return ("chunks_hnsw_" + collection_id.encode("utf-8").hex())[:63]


class PostgresStore:
    """DocumentStore on PostgreSQL with pgvector; RAG_STORE=postgres, RAG_POSTGRES_URL."""

    backend_name = "postgres"

    def __init__(self, url: str, *, max_connections: int = 16) -> None:
        self._url = url
        self._pool: ConnectionPool[Connection[Row]] = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            open=True,
            configure=self._configure,
            check=_check_idle,
            timeout=POOL_WAIT_S,
            reconnect_timeout=POOL_WAIT_S,
            kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": None},
            connection_class=Connection[Row],
        )
        self._local = threading.local()
        self._pinned: list[Connection[Row]] = []
        self._pinned_lock = threading.Lock()
        self._technique_indexes: list[TechniqueIndex] = []
        self._technique_storages: TechniqueStorages[PostgresStore] = TechniqueStorages("postgres")
        try:
            with self._pool.connection() as connection:
                migrate(connection)
                # The vector type exists only now (first migration): register its adapters afterwards.
                register_vector(connection)
        except BaseException:
            self._pool.close()  # a store that failed to start keeps no connection open
            raise

    @staticmethod
    def _configure(connection: Connection[Row]) -> None:
        # jsonb writes a float such as 1e20 as 100000000000000000000: json.loads would read an integer past
        # 64 bits (no answer can encode it), orjson reads a float, as SQLite's rows are read.
        set_json_loads(orjson.loads, connection)
        try:
            register_vector(connection)
        except Exception:  # a fresh database has no vector type before the migration
            logger.debug("pgvector type not registered yet on a new connection")

    # Connections: each thread keeps one from the pool, so a technique's storage reaches the very
    # connection of the thread's open transaction.
    def connection(self) -> Connection[Row]:
        """The calling thread's connection (inside this backend only: its technique storage uses it).

        One the server ended while it was idle (a restart) is given back and replaced here, so the call
        goes on; inside a transaction it is kept, and the transaction fails with it.
        """
        connection: Connection[Row] | None = getattr(self._local, "connection", None)
        if (
            connection is not None
            and not getattr(self._local, "depth", 0)
            and connection.info.transaction_status in (TransactionStatus.IDLE, TransactionStatus.UNKNOWN)
        ):
            try:
                _check_idle(connection)
            except OperationalError:
                self._local.connection = None
                with self._pinned_lock:
                    self._pinned.remove(connection)
                self._pool.putconn(connection)  # the pool closes it and opens another in its place
                connection = None
        if connection is None:
            # A server still down raises here (PoolTimeout), the thread left with no connection to retry.
            connection = self._pool.getconn()
            try:
                register_vector(connection)
            except BaseException:
                self._pool.putconn(connection)
                raise
            self._local.connection = connection
            with self._pinned_lock:
                self._pinned.append(connection)
        return connection

    @contextmanager
    def transaction(self) -> Iterator[Connection[Row]]:
        """One write transaction on the thread's connection: commits on success, rolls back on error.

        Nested calls are savepoints of the outermost. The HNSW index of a collection created inside is
        built at the outermost one's end, after all its rows and before the commit: one build instead of
        an insertion per row, and other connections never see the collection without its index.
        """
        connection = self.connection()
        depth: int = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            with connection.transaction():
                yield connection
                if depth == 0:
                    self._pack_staged(connection)
                    self._add_deferred_term_counts(connection)
                    self._build_pending_indexes(connection)
        finally:
            self._local.depth = depth
            if depth == 0:
                self._local.pending_indexes = {}
                self._local.deferred_terms = {}
                self._local.staged = False

    @contextmanager
    def bulk_load(self) -> Iterator[Connection[Row]]:
        """One transaction for a large load (`iris-rag migrate`, bench_scale).

        Every upsert inside writes by COPY whatever its size, and new collections get their HNSW index
        once, after their rows.

        Nothing of it is visible to other connections before the commit, and an error or interruption
        rolls all of it back: no half collection. The index build holds a SHARE lock on the chunks table
        until the commit: readers go on, other writers wait. After the commit (of an outermost bulk load)
        the tables are vacuumed and analyzed: the keyword leg's index-only scans then skip the heap at
        once, not after autovacuum came round, and the planner knows the new sizes.
        """
        previous: bool = getattr(self._local, "bulk", False)
        outermost = not getattr(self._local, "depth", 0)
        self._local.bulk = True
        try:
            with self.transaction() as connection:
                yield connection
        finally:
            self._local.bulk = previous
        # (Not inside a transaction the caller opened on the connection itself: VACUUM cannot run there.)
        if outermost and connection.info.transaction_status == TransactionStatus.IDLE:
            connection.execute("VACUUM (ANALYZE) chunks, documents, keyword_blocks, keyword_terms")

    def _pending_indexes(self) -> dict[str, int]:
        pending: dict[str, int] | None = getattr(self._local, "pending_indexes", None)
        if pending is None:
            pending = self._local.pending_indexes = {}
        return pending

    def _build_pending_indexes(self, connection: Connection[Row]) -> None:
        """The HNSW index of each collection created in this transaction (still there), after its rows."""
        pending = self._pending_indexes()
        for collection_id, dimension in pending.items():
            row = connection.execute(
                "SELECT t.chunks FROM collections c JOIN keyword_totals t ON t.collection_id = c.id "
                "WHERE c.id = %s",
                (collection_id,),
            ).fetchone()
            if row is None:  # rolled back to a savepoint, or deleted again
                continue
            low, high = HNSW_BUILD_MEMORY_MB
            needed = int(row["chunks"]) * (4 * dimension + HNSW_BUILD_BYTES_PER_CHUNK) // 2**20
            connection.execute(
                sql.SQL("SET LOCAL maintenance_work_mem = {}").format(
                    sql.Literal(f"{min(high, max(low, needed))}MB")
                )
            )
            connection.execute(
                sql.SQL("SET LOCAL max_parallel_maintenance_workers = {}").format(HNSW_BUILD_WORKERS)
            )
            connection.execute(
                sql.SQL(
                    "CREATE INDEX IF NOT EXISTS {} ON chunks USING hnsw "
                    "((embedding::vector({})) vector_cosine_ops) WITH (ef_construction = 128) "
                    "WHERE collection_id = {}"
                ).format(sql.Identifier(_hnsw_index_name(collection_id)), int(dimension), collection_id)
            )
        pending.clear()

    @contextmanager
    def separate_connection(self) -> Iterator[Connection[Row]]:
        """A pool connection apart from the thread's own (rag_sqlrag's read-only statements use one)."""
        with self._pool.connection() as connection:
            yield connection

    def register_index(self, index: TechniqueIndex) -> None:
        """Keep a technique's index in step with every later upsert and delete (in their transactions)."""
        with self._pinned_lock:
            self._technique_indexes.append(index)

    def technique_storage(self, contract: type[T]) -> T:
        """The PostgreSQL implementation of a technique's storage contract, made once per store."""
        from iris_rag.backends.postgres import TECHNIQUE_STORAGE  # the package imports this module

        return self._technique_storages.get(self, contract, TECHNIQUE_STORAGE)

    def ping(self) -> None:
        """Run a trivial query."""
        self.connection().execute("SELECT 1").fetchone()

    def same_store_as(self, other: object) -> bool:
        """Whether another opened store is this one, however its URL reaches the server (migrate's check).

        Asked of the servers, since URLs cannot tell (localhost, 127.0.0.1, a socket, a proxy): this store
        holds an advisory lock on a random key in a transaction while the other tries to take it, which
        fails only in the same database of the same server (advisory locks belong to a database). Any role
        may take one, and nothing is written. There, the same store is the same tables: those the
        unqualified names reach through each login's search_path.
        """
        if other is self:
            return True
        if not isinstance(other, PostgresStore):
            return False
        key = secrets.randbits(63)
        probe = "to_regclass('collections')::oid AS tables"
        with self.transaction() as connection:
            mine = connection.execute(f"SELECT pg_advisory_xact_lock(%s), {probe}", (key,)).fetchone()
            theirs = (
                other.connection()
                .execute(f"SELECT pg_try_advisory_xact_lock(%s) AS free, {probe}", (key,))
                .fetchone()
            )
        assert mine is not None and theirs is not None
        return not theirs["free"] and mine["tables"] == theirs["tables"]

    def close(self) -> None:
        """Give back every thread's connection and close the pool."""
        with self._pinned_lock:
            for connection in self._pinned:
                if not connection.closed:
                    self._pool.putconn(connection)
            self._pinned.clear()
        self._local = threading.local()
        self._pool.close()

    # Collections
    def get_collection(self, collection_id: str) -> CollectionInfo | None:
        """The collection with counts, or None."""
        row = self.connection().execute(f"{_COLLECTION_SELECT} WHERE c.id = %s", (collection_id,)).fetchone()
        return collection_info(row) if row else None

    def create_collection(self, collection_id: str, embedding_model: str, dimension: int) -> CollectionInfo:
        """Create the collection if absent and return it."""
        with self.transaction() as connection:
            self._insert_collection(connection, collection_id, embedding_model, dimension)
        info = self.get_collection(collection_id)
        assert info is not None
        return info

    def _insert_collection(
        self, connection: Connection[Row], collection_id: str, embedding_model: str, dimension: int
    ) -> None:
        """The collection row and keyword totals, if absent (in the caller's transaction).

        Its HNSW index comes at the end of the outermost transaction (_build_pending_indexes).
        """
        now = _now()
        inserted = connection.execute(
            "INSERT INTO collections (id, embedding_model, dimension, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
            (collection_id, embedding_model, dimension, now, now),
        ).rowcount
        connection.execute(
            "INSERT INTO keyword_totals VALUES (%s, 0, 0, 0, 0, 0) ON CONFLICT (collection_id) DO NOTHING",
            (collection_id,),
        )
        if inserted:
            # A partial index over this collection's rows, at its dimension: searches name both.
            self._pending_indexes()[collection_id] = int(dimension)

    def list_collections(self) -> list[CollectionInfo]:
        """Every collection with counts."""
        rows = self.connection().execute(f"{_COLLECTION_SELECT} ORDER BY c.id").fetchall()
        return [collection_info(row) for row in rows]

    def set_description(self, collection_id: str, description: str) -> CollectionInfo | None:
        """Set the collection's description; None if there is no such collection."""
        with self.transaction() as connection:
            updated = connection.execute(
                "UPDATE collections SET description = %s, updated_at = %s WHERE id = %s",
                (description, _now(), collection_id),
            ).rowcount
        return self.get_collection(collection_id) if updated else None

    # Documents
    def upsert_documents(
        self,
        collection_id: str,
        documents: list[DocumentInput],
        prepared: dict[str, Any] | None = None,
        *,
        new_collection: NewCollection | None = None,
    ) -> int:
        """Insert or replace documents, their chunks, keyword rows and technique rows in one transaction."""
        now = _now()
        written = 0
        with self.transaction() as connection:
            if new_collection is not None:
                model, dimension = new_collection.embedding_model, new_collection.dimension
                self._insert_collection(connection, collection_id, model, dimension)
            # Serializes writers of one collection: the totals row is updated by each.
            connection.execute(
                "SELECT 1 FROM keyword_totals WHERE collection_id = %s FOR UPDATE", (collection_id,)
            )
            ids = [document.id for document in documents]
            bulk = (
                getattr(self._local, "bulk", False)
                or sum(len(d.chunks) for d in documents) >= BULK_MIN_CHUNKS
            )
            # A batch naming a document twice takes the row path (each replaces the one before).
            for document in documents if not bulk or len(set(ids)) < len(ids) else []:
                previous = connection.execute(
                    "SELECT * FROM documents WHERE collection_id = %s AND id = %s",
                    (collection_id, document.id),
                ).fetchone()
                created_at, updated_at = written_dates(
                    None if previous is None else stored_document(previous), document, now
                )
                self._delete_document_rows(connection, collection_id, document.id, replaced_by=document)
                connection.execute(
                    "INSERT INTO documents (collection_id, id, title, content, metadata, created_at, "
                    "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (
                        collection_id,
                        document.id,
                        document.title,
                        document.content,
                        Jsonb(document.metadata),
                        created_at,
                        updated_at,
                    ),
                )
                self._insert_chunks(connection, collection_id, document)
                written += len(document.chunks)
            if bulk and len(set(ids)) == len(ids):
                written = self._copy_documents(connection, collection_id, documents, now)
            for index in self._technique_indexes:
                if prepared is not None and index.name in prepared:
                    index.write(collection_id, documents, prepared[index.name])
            connection.execute("UPDATE collections SET updated_at = %s WHERE id = %s", (now, collection_id))
            check_cancelled()
        return written

    def _insert_chunks(
        self, connection: Connection[Row], collection_id: str, document: DocumentInput
    ) -> None:
        (title_terms, title_length), *contents = term_frequencies(
            [document.title, *(chunk.content for chunk in document.chunks)]
        )
        # As in FTS5's title table: a chunk of an untitled document is no row of the title field.
        titled = bool(document.title.strip())
        totals = [0, 0, 0, 0]
        term_counts: dict[str, list[int]] = {}
        postings: list[Posting] = []
        for chunk, (content_terms, content_length) in zip(document.chunks, contents, strict=True):
            row = connection.execute(
                """INSERT INTO chunks (collection_id, document_id, chunk_id, chunk_index, content, start_char,
                       end_char, embedding, title_length, content_length, titled)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING row_id""",
                _chunk_values(collection_id, document, chunk, title_length, content_length, titled),
            ).fetchone()
            assert row is not None
            terms = _count_chunk(
                totals, term_counts, titled, title_terms, title_length, content_terms, content_length
            )
            postings.extend(
                _posting_values(
                    collection_id,
                    row["row_id"],
                    terms,
                    title_terms,
                    title_length,
                    content_terms,
                    content_length,
                )
            )
        self._pack_staged(connection)  # staged rows first: this document's rows come after them
        keyword_blocks.append_postings(connection, collection_id, postings)
        self._add_totals(connection, collection_id, totals, documents=1)
        self._add_term_counts(connection, collection_id, term_counts)

    def _copy_documents(
        self, connection: Connection[Row], collection_id: str, documents: list[DocumentInput], now: str
    ) -> int:
        """The documents, chunks and keyword postings by binary COPY.

        The rows the row path writes, in the same order: chunk rows come from the sequence in document
        and chunk order.
        """
        previous = {
            row["id"]: stored_document(row)
            for row in connection.execute(
                "SELECT * FROM documents WHERE collection_id = %s AND id = ANY(%s)",
                (collection_id, [document.id for document in documents]),
            ).fetchall()
        }
        replacing = {document.id: document for document in documents}
        for document_id in previous:
            self._delete_document_rows(
                connection, collection_id, document_id, replaced_by=replacing[document_id]
            )
        count = sum(len(document.chunks) for document in documents)
        with connection.cursor(row_factory=tuple_row) as cursor:
            row_ids = sorted(
                int(row[0])
                for row in cursor.execute(
                    "SELECT nextval(pg_get_serial_sequence('chunks', 'row_id')) FROM generate_series(1, %s)",
                    (count,),
                )
            )
            frequencies = term_frequencies(
                [text for d in documents for text in (d.title, *(chunk.content for chunk in d.chunks))]
            )
            with cursor.copy(
                "COPY documents (collection_id, id, title, content, metadata, created_at, updated_at) "
                "FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "text", "text", "text", "jsonb", "text", "text"])
                for document in documents:
                    copy.write_row(
                        (
                            collection_id,
                            document.id,
                            document.title,
                            document.content,
                            Jsonb(document.metadata),
                            *written_dates(previous.get(document.id), document, now),
                        )
                    )
            postings: list[Posting] = []
            totals = [0, 0, 0, 0]
            term_counts: dict[str, list[int]] = {}
            with cursor.copy(
                "COPY chunks (row_id, collection_id, document_id, chunk_id, chunk_index, content, "
                "start_char, end_char, embedding, title_length, content_length, titled) "
                "FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(
                    [
                        "int8",
                        "text",
                        "text",
                        "text",
                        "int4",
                        "text",
                        "int4",
                        "int4",
                        "vector",
                        "int4",
                        "int4",
                        "bool",
                    ]
                )
                position = 0
                rows = iter(row_ids)
                for document in documents:
                    title_terms, title_length = frequencies[position]
                    contents = frequencies[position + 1 : position + 1 + len(document.chunks)]
                    position += 1 + len(document.chunks)
                    titled = bool(document.title.strip())
                    for chunk, (content_terms, content_length) in zip(document.chunks, contents, strict=True):
                        row_id = next(rows)
                        values = _chunk_values(
                            collection_id, document, chunk, title_length, content_length, titled
                        )
                        copy.write_row((row_id, *values))
                        terms = _count_chunk(
                            totals,
                            term_counts,
                            titled,
                            title_terms,
                            title_length,
                            content_terms,
                            content_length,
                        )
                        postings.extend(
                            _posting_values(
                                collection_id,
                                row_id,
                                terms,
                                title_terms,
                                title_length,
                                content_terms,
                                content_length,
                            )
                        )
        # Packed into blocks at the transaction's end, with every other batch's (pack_staged).
        keyword_blocks.stage_postings(connection, postings)
        self._local.staged = True
        self._add_totals(connection, collection_id, totals, documents=len(documents))
        self._add_term_counts(connection, collection_id, term_counts)
        return count

    def _pack_staged(self, connection: Connection[Row]) -> None:
        """Staged postings into blocks: before rows are appended or taken out, and at the end."""
        if getattr(self._local, "staged", False):
            keyword_blocks.pack_staged(connection)
            self._local.staged = False

    def _add_deferred_term_counts(self, connection: Connection[Row]) -> None:
        """keyword_terms' changes a bulk load gathered, added once at its end."""
        deferred: dict[str, dict[str, list[int]]] = getattr(self._local, "deferred_terms", {})
        for collection_id in sorted(deferred):
            self._add_term_counts(connection, collection_id, deferred[collection_id], deferred_ok=False)
        deferred.clear()

    def _add_term_counts(
        self,
        connection: Connection[Row],
        collection_id: str,
        counts: dict[str, list[int]],
        *,
        deferred_ok: bool = True,
    ) -> None:
        """Add to keyword_terms' counts (chunks, title chunks, content chunks per term); drop terms at 0.

        Inside bulk_load the changes are gathered and added once, at the end: an update of the same term
        rows per batch, in one transaction, walks each row's growing chain of versions (10 s a batch
        by 480K chunks).
        """
        if not counts:
            return
        if deferred_ok and getattr(self._local, "bulk", False):
            deferred: dict[str, dict[str, list[int]]] | None = getattr(self._local, "deferred_terms", None)
            if deferred is None:
                deferred = self._local.deferred_terms = {}
            gathered = deferred.setdefault(collection_id, {})
            for term, change in counts.items():
                into = gathered.setdefault(term, [0, 0, 0])
                for i in range(3):
                    into[i] += change[i]
            return
        terms = sorted(counts)
        connection.execute(
            """INSERT INTO keyword_terms AS k
                   SELECT %s, * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[])
               ON CONFLICT (collection_id, term) DO UPDATE SET chunks = k.chunks + EXCLUDED.chunks,
                   title_chunks = k.title_chunks + EXCLUDED.title_chunks,
                   content_chunks = k.content_chunks + EXCLUDED.content_chunks""",
            (collection_id, terms, *([counts[t][i] for t in terms] for i in range(3))),
        )
        if any(counts[t][0] < 0 for t in terms):
            connection.execute(
                "DELETE FROM keyword_terms WHERE collection_id = %s AND term = ANY(%s) AND chunks <= 0",
                (collection_id, terms),
            )

    @staticmethod
    def _add_totals(
        connection: Connection[Row], collection_id: str, totals: list[int], documents: int = 0
    ) -> None:
        connection.execute(
            """UPDATE keyword_totals SET chunks = chunks + %s, titled_chunks = titled_chunks + %s,
                   title_tokens = title_tokens + %s, content_tokens = content_tokens + %s,
                   documents = documents + %s
               WHERE collection_id = %s""",
            (*totals, documents, collection_id),
        )

    def _delete_document_rows(
        self,
        connection: Connection[Row],
        collection_id: str,
        document_id: str,
        *,
        replaced_by: DocumentInput | None = None,
    ) -> int:
        """The document's rows everywhere; its cached vectors too, but for those of `replaced_by`'s text."""
        for index in self._technique_indexes:
            index.delete(collection_id, document_id)
        # IS DISTINCT FROM NULL without a replacement: every vector the document owns.
        kept = None if replaced_by is None else document_source(replaced_by.title, replaced_by.content)
        connection.execute(
            "DELETE FROM embedding_cache WHERE collection_id = %s AND document_id = %s "
            "AND source_hash IS DISTINCT FROM %s::bytea",
            (collection_id, document_id, kept),
        )
        # The postings out of their blocks, found from the chunks' text tokenized again as it was written
        # (FTS5 deletes the same way), and their terms off keyword_terms' counts.
        with connection.cursor(row_factory=tuple_row) as cursor:
            stored = cursor.execute(
                """SELECT k.row_id, k.content, d.title FROM chunks k JOIN documents d
                       ON d.collection_id = k.collection_id AND d.id = k.document_id
                   WHERE k.collection_id = %s AND k.document_id = %s ORDER BY k.chunk_index""",
                (collection_id, document_id),
            ).fetchall()
        if stored:
            (title_terms, _), *contents = term_frequencies([stored[0][2], *(row[1] for row in stored)])
            term_counts: dict[str, list[int]] = {}
            pairs: list[tuple[str, int]] = []
            for (row_id, _, _), (content_terms, _) in zip(stored, contents, strict=True):
                terms = title_terms.keys() | content_terms.keys()
                _count_terms(term_counts, terms, title_terms, content_terms)
                pairs.extend((term, int(row_id)) for term in sorted(terms))
            self._pack_staged(connection)  # the chunks may have been written by this transaction's bulk path
            keyword_blocks.remove_postings(connection, collection_id, pairs)
            self._add_term_counts(
                connection, collection_id, {t: [-n for n in c] for t, c in term_counts.items()}
            )
        removed = connection.execute(
            """DELETE FROM chunks WHERE collection_id = %s AND document_id = %s
               RETURNING titled, title_length, content_length""",
            (collection_id, document_id),
        ).fetchall()
        deleted = connection.execute(
            "DELETE FROM documents WHERE collection_id = %s AND id = %s", (collection_id, document_id)
        ).rowcount
        if removed or deleted:
            self._add_totals(
                connection,
                collection_id,
                [
                    -len(removed),
                    -sum(int(r["titled"]) for r in removed),
                    -sum(r["title_length"] for r in removed),
                    -sum(r["content_length"] for r in removed),
                ],
                documents=-deleted,
            )
        return deleted

    def delete_document(self, collection_id: str, document_id: str) -> bool:
        """Delete a document and its chunks; False if it was absent."""
        with self.transaction() as connection:
            connection.execute(
                "SELECT 1 FROM keyword_totals WHERE collection_id = %s FOR UPDATE", (collection_id,)
            )
            deleted = self._delete_document_rows(connection, collection_id, document_id)
            connection.execute(
                "UPDATE collections SET updated_at = %s WHERE id = %s", (_now(), collection_id)
            )
        return deleted > 0

    @contextmanager
    def collection_transaction(self, collection_id: str) -> Iterator[Connection[Row]]:
        """A transaction serialized with the collection's writers by its keyword totals row (they lock it)."""
        with self.transaction() as connection:
            connection.execute(
                "SELECT 1 FROM keyword_totals WHERE collection_id = %s FOR UPDATE", (collection_id,)
            )
            yield connection

    @contextmanager
    def index_transaction(self, collection_id: str, document_ids: list[str]) -> Iterator[Connection[Row]]:
        """A transaction for technique rows built after the documents' commit.

        Serialized with the collection's writers (collection_transaction); the documents' no-op update
        moves the data version on (the trigger).
        """
        with self.collection_transaction(collection_id) as connection:
            yield connection
            connection.execute(
                "UPDATE documents SET updated_at = updated_at WHERE collection_id = %s AND id = ANY(%s)",
                (collection_id, document_ids),
            )

    def delete_collection(self, collection_id: str) -> int | None:
        """Each document through the technique indexes, then the collection row and what hangs on it.

        Documents and chunks follow the collection row by cascade; its keyword totals, terms and blocks
        and its HNSW index go by name.
        """
        with self.transaction() as connection:
            if (
                connection.execute("SELECT 1 FROM collections WHERE id = %s", (collection_id,)).fetchone()
                is None
            ):
                return None
            connection.execute(
                "SELECT 1 FROM keyword_totals WHERE collection_id = %s FOR UPDATE", (collection_id,)
            )
            document_ids = [
                row["id"]
                for row in connection.execute(
                    "SELECT id FROM documents WHERE collection_id = %s", (collection_id,)
                ).fetchall()
            ]
            for document_id in document_ids:
                check_cancelled()
                for index in self._technique_indexes:
                    index.delete(collection_id, document_id)
            for index in self._technique_indexes:
                if isinstance(index, CollectionState):
                    index.drop_collection(collection_id)
            connection.execute("DELETE FROM collections WHERE id = %s", (collection_id,))
            connection.execute("DELETE FROM embedding_cache WHERE collection_id = %s", (collection_id,))
            # Its version stays (versions never repeat); its log goes, so any older cached state reloads.
            connection.execute("DELETE FROM collection_changes WHERE collection_id = %s", (collection_id,))
            connection.execute("DELETE FROM keyword_totals WHERE collection_id = %s", (collection_id,))
            connection.execute("DELETE FROM keyword_terms WHERE collection_id = %s", (collection_id,))
            keyword_blocks.delete_collection(connection, collection_id)
            connection.execute(
                sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(_hnsw_index_name(collection_id)))
            )
        return len(document_ids)

    def get_document(self, collection_id: str, document_id: str) -> StoredDocument | None:
        """One document, or None."""
        row = (
            self.connection()
            .execute(
                "SELECT * FROM documents WHERE collection_id = %s AND id = %s", (collection_id, document_id)
            )
            .fetchone()
        )
        if row is None:
            return None
        return stored_document(row)

    def document_ids(self, collection_id: str) -> list[str]:
        """Every document id of the collection, in insertion order."""
        rows = (
            self.connection()
            .execute("SELECT id FROM documents WHERE collection_id = %s ORDER BY row_id", (collection_id,))
            .fetchall()
        )
        return [row["id"] for row in rows]

    def list_documents(self, collection_id: str, offset: int, limit: int) -> list[DocumentSummary]:
        """A page of the collection's documents, in insertion order."""
        rows = (
            self.connection()
            .execute(
                """SELECT d.id, d.title, length(d.content) AS chars, d.created_at, d.updated_at,
                          (SELECT COUNT(*) FROM chunks k WHERE k.collection_id = d.collection_id
                           AND k.document_id = d.id) AS chunks
                   FROM documents d WHERE d.collection_id = %s ORDER BY d.row_id LIMIT %s OFFSET %s""",
                (collection_id, limit, offset),
            )
            .fetchall()
        )
        return [document_summary(row) for row in rows]

    def get_document_chunks(self, collection_id: str, document_id: str) -> list[StoredChunk]:
        """A document's chunks in order."""
        rows = (
            self.connection()
            .execute(
                f"{_CHUNK_SELECT} WHERE k.collection_id = %s AND k.document_id = %s ORDER BY k.chunk_index",
                (collection_id, document_id),
            )
            .fetchall()
        )
        return [stored_chunk(row) for row in rows]

    def get_chunks(self, collection_id: str, chunk_ids: list[str]) -> list[StoredChunk]:
        """Chunks by id, in the order asked."""
        if not chunk_ids:
            return []
        rows = (
            self.connection()
            .execute(
                f"{_CHUNK_SELECT} WHERE k.collection_id = %s AND k.chunk_id = ANY(%s)",
                (collection_id, chunk_ids),
            )
            .fetchall()
        )
        by_id = {row["chunk_id"]: stored_chunk(row) for row in rows}
        return [by_id[chunk_id] for chunk_id in chunk_ids if chunk_id in by_id]

    # Search
    def data_version(self, collection_id: str) -> int:
        """The collection's data version: any process's write or delete of its documents moves it on."""
        row = (
            self.connection()
            .execute("SELECT version FROM collection_versions WHERE collection_id = %s", (collection_id,))
            .fetchone()
        )
        return int(row["version"]) if row else 0

    def changed_documents(self, collection_id: str, since: int, through: int, limit: int) -> set[str] | None:
        """From collection_changes, the log the version trigger writes (None: a gap, or over `limit`)."""
        rows = (
            self.connection()
            .execute(
                "SELECT version, document_id FROM collection_changes "
                "WHERE collection_id = %s AND version > %s",
                (collection_id, since),
            )
            .fetchall()
        )
        return logged_documents(((row["version"], row["document_id"]) for row in rows), since, through, limit)

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """A REPEATABLE READ, READ ONLY transaction on the thread's connection (or the one already open)."""
        connection = self.connection()
        if connection.info.transaction_status != TransactionStatus.IDLE:
            yield
            return
        with connection.transaction():
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield

    def vector_search(
        self,
        collection_id: str,
        query_vector: npt.NDArray[np.float32],
        top_k: int,
        metadata_filter: MetadataFilter | None = None,
    ) -> list[ScoredChunk]:
        """Cosine top_k: exact on small collections or under a filter, else through the HNSW index."""
        info = (
            self.connection()
            .execute(
                "SELECT c.dimension, t.chunks FROM collections c "
                "JOIN keyword_totals t ON t.collection_id = c.id WHERE c.id = %s",
                (collection_id,),
            )
            .fetchone()
        )
        if info is None or top_k <= 0:
            return []
        vector = Vector(np.asarray(query_vector, dtype=np.float32))
        if metadata_filter is not None or info["chunks"] <= EXACT_SEARCH_MAX_CHUNKS:
            # The bare column matches no index (they are on the cast expression): an exact scan.
            where, parameters = to_sql(metadata_filter)
            query = sql.SQL(
                """SELECT k.chunk_id, 1 - (k.embedding <=> %(q)s) AS score FROM chunks k
                   JOIN documents d ON d.collection_id = k.collection_id AND d.id = k.document_id
                   WHERE k.collection_id = %(collection)s AND {}
                   ORDER BY k.embedding <=> %(q)s, k.row_id LIMIT %(top_k)s"""
            ).format(where)
            arguments = {"q": vector, "collection": collection_id, "top_k": top_k, **parameters}
            rows = self.connection().execute(query, arguments).fetchall()
        else:
            cast_to = sql.SQL("::vector({})").format(int(info["dimension"]))
            query = sql.SQL(
                """SELECT chunk_id, 1 - (embedding{cast} <=> %s{cast}) AS score FROM chunks
                   WHERE collection_id = {collection}
                   ORDER BY embedding{cast} <=> %s{cast} LIMIT %s"""
            ).format(cast=cast_to, collection=sql.Literal(collection_id))
            with self.transaction() as connection:
                # Enough candidates for top_k: the default (40) would cap the results.
                connection.execute(
                    sql.SQL("SET LOCAL hnsw.ef_search = {}").format(ef_search(top_k, int(info["chunks"])))
                )
                # For a LIMIT near 100 the planner costs a sequential scan and sort below the index
                # (35 ms against 3 ms on SciFact's 10,299 chunks): this statement is for the index.
                connection.execute("SET LOCAL enable_seqscan = off")
                rows = connection.execute(query, (vector, vector, top_k)).fetchall()
        return [ScoredChunk(row["chunk_id"], float(row["score"])) for row in rows]

    def vector_scores(
        self, collection_id: str, query_vector: npt.NDArray[np.float32], chunk_ids: list[str]
    ) -> dict[str, float]:
        """Exact cosine similarity of the given chunks (unknown ids are left out)."""
        if not chunk_ids:
            return {}
        rows = (
            self.connection()
            .execute(
                "SELECT chunk_id, 1 - (embedding <=> %s) AS score FROM chunks "
                "WHERE collection_id = %s AND chunk_id = ANY(%s)",
                (Vector(np.asarray(query_vector, dtype=np.float32)), collection_id, chunk_ids),
            )
            .fetchall()
        )
        scores = {row["chunk_id"]: float(row["score"]) for row in rows}
        return {c: scores[c] for c in chunk_ids if c in scores}

    def chunk_vectors(self, collection_id: str, chunk_ids: list[str]) -> dict[str, npt.NDArray[np.float32]]:
        """The stored vectors of the given chunks (unknown ids are left out)."""
        if not chunk_ids:
            return {}
        rows = (
            self.connection()
            .execute(
                "SELECT chunk_id, embedding FROM chunks WHERE collection_id = %s AND chunk_id = ANY(%s)",
                (collection_id, chunk_ids),
            )
            .fetchall()
        )
        return {row["chunk_id"]: np.asarray(row["embedding"].to_numpy(), dtype=np.float32) for row in rows}

    def keyword_search(
        self,
        collection_id: str,
        query: KeywordQuery,
        top_k: int,
        metadata_filter: MetadataFilter | None = None,
    ) -> list[ScoredChunk]:
        """BM25 (k1 1.2, b 0.75) from the collection's own statistics, as SQLite FTS5's bm25 scores it.

        flat: one BM25 over title and content (term frequency = title_weight x title count + content
        count; length = both fields' tokens); multifield: each field's own BM25 (own IDF over the chunks
        having the field, own average length), t = title_weight x title score, c = content score,
        max(t, c) + 0.5 x min(t, c). IDF is FTS5's: ln((N - n + 0.5) / (n + 0.5)), at least 1e-6, over the
        whole collection even under a metadata filter. A term of weight w counts w times.
        """
        stems = query_stems(query.terms)
        if not stems or top_k <= 0:
            return []
        connection = self.connection()
        with connection.transaction():  # one snapshot: the postings and the totals they add up to
            totals_row = connection.execute(
                "SELECT chunks, titled_chunks, title_tokens, content_tokens FROM keyword_totals "
                "WHERE collection_id = %s",
                (collection_id,),
            ).fetchone()
            if totals_row is None:
                return []
            counted = {
                row["term"]: row
                for row in connection.execute(
                    "SELECT term, chunks, title_chunks, content_chunks FROM keyword_terms "
                    "WHERE collection_id = %s AND term = ANY(%s) AND chunks > 0",
                    (collection_id, list(stems)),
                ).fetchall()
            }
            if not counted:
                return []
            allowed = self._filtered_chunk_rows(connection, collection_id, metadata_filter)
            allowed_rows = (
                None if allowed is None else np.fromiter(allowed, dtype=np.int64, count=len(allowed))
            )
            weights = np.asarray(list(stems.values()), dtype=np.float64)
            totals = Totals(**totals_row)
            if sum(int(row["chunks"]) for row in counted.values()) > PRUNE_MIN_POSTINGS:
                chunk_rows, scores = self._max_score(
                    connection, collection_id, stems, counted, totals, query, top_k, allowed_rows
                )
            else:
                with connection.cursor(binary=True, row_factory=tuple_row) as cursor:
                    rows = cursor.execute(POSTINGS_SQL, (collection_id, list(stems))).fetchall()
                index = {term: i for i, term in enumerate(stems)}
                chunk_rows, scores = bm25_scores(
                    keyword_blocks.postings_of(rows, index),
                    weights,
                    totals,
                    query.scoring,
                    float(query.title_weight),
                )
        if allowed_rows is not None:
            keep = np.isin(chunk_rows, allowed_rows)
            chunk_rows, scores = chunk_rows[keep], scores[keep]
        if len(scores) > top_k:  # the top_k and their ties only: sorting a million scores took ~100 ms
            near = np.flatnonzero(scores >= _kth_largest(scores, top_k))
            chunk_rows, scores = chunk_rows[near], scores[near]
        # Best first; equal scores by chunk row (insertion order), as the SQL store did.
        order = np.lexsort((chunk_rows, -scores))[:top_k]
        best = [int(row) for row in chunk_rows[order]]
        ids = {
            row["row_id"]: row["chunk_id"]
            for row in connection.execute(
                "SELECT row_id, chunk_id FROM chunks WHERE row_id = ANY(%s)", (best,)
            ).fetchall()
        }
        return [
            ScoredChunk(ids[row], float(score))
            for row, score in zip(best, scores[order], strict=True)
            if row in ids
        ]

    @staticmethod
    def _max_score(
        connection: Connection[Row],
        collection_id: str,
        stems: dict[str, int],
        counted: dict[str, Row],
        totals: Totals,
        query: KeywordQuery,
        top_k: int,
        allowed: npt.NDArray[np.int64] | None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Chunk rows and exact BM25 scores of a set of chunks holding the true top_k (MaxScore).

        The terms are taken rarest first; each one's postings are read whole ("essential" terms). With
        the rest bounded (bm25_bounds: what their postings can add at most), a chunk they alone hold
        scores below that bound, and a chunk of the essential postings below its partial score plus that
        bound. Once the bound of the rest is below the top_k-th partial score (a floor under the final
        top_k-th score), only the chunks whose partial score plus the bound reaches that floor can rank.
        Then the rest, a term at a time: the blocks holding those chunks are read (or the term whole, where
        that costs less), their parts added, and the chunks whose score can no longer reach the raised
        floor with what is left dropped. The survivors' scores are exact. Until then, the next term is
        read whole, up to every term (then it is the unpruned ranking).
        """
        index = {term: i for i, term in enumerate(stems)}
        weights = np.asarray(list(stems.values()), dtype=np.float64)

        def column(field: str) -> npt.NDArray[np.float64]:
            return np.asarray([float(counted[s][field]) if s in counted else 0.0 for s in stems])

        counts = TermCounts(column("chunks"), column("title_chunks"), column("content_chunks"))
        scoring, title_weight = query.scoring, float(query.title_weight)
        title_bound, content_bound = bm25_bounds(weights, totals, scoring, title_weight, counts)
        terms = sorted(counted, key=lambda term: (int(counted[term]["chunks"]), term))
        read: list[Postings] = []  # each term's, decoded once
        starts: dict[str, npt.NDArray[np.int64]] = {}  # where each frequent term's blocks start
        partial_parts = PartialParts(totals.chunks)

        def parts(postings: Postings) -> tuple[npt.NDArray[np.int64], Floats, Floats]:
            return bm25_parts(postings, weights, totals, scoring, title_weight, counts)

        def bound(positions: list[int]) -> tuple[float, float]:
            """The most the terms at these positions add to a chunk's (title part, content part)."""
            return float(title_bound[positions].sum()), float(content_bound[positions].sum())

        def combined(title_part: float, content_part: float) -> float:
            return float(combine_parts(np.array([title_part]), np.array([content_part]), scoring)[0])

        with connection.cursor(binary=True, row_factory=tuple_row) as cursor:
            for essential in range(1, len(terms) + 1):
                new = keyword_blocks.postings_of(
                    cursor.execute(POSTINGS_SQL, (collection_id, [terms[essential - 1]])).fetchall(), index
                )
                read.append(new)
                rest = [index[term] for term in terms[essential:]]
                if not rest:
                    break
                # The essential terms' parts so far, a term added at a time: they only steer the pruning
                # (bm25_bounds leave a margin for the order of the sums); the scores returned are summed
                # in the query's term order, as the unpruned ranking sums them.
                partial_parts.add(*parts(new))
                rest_title, rest_content = bound(rest)
                alone = combined(rest_title, rest_content)
                if alone >= combined(*bound([index[term] for term in terms[:essential]])):
                    continue  # the floor is at most what the terms read can give: no use computing it
                rows, title, content = partial_parts.arrays()
                if allowed is not None:
                    keep = np.isin(rows, allowed)
                    rows, title, content = rows[keep], title[keep], content[keep]
                if len(rows) < top_k:
                    continue
                floor = _kth_largest(combine_parts(title, content, scoring), top_k)
                if alone >= floor:
                    continue
                keep = combine_parts(title + rest_title, content + rest_content, scoring) >= floor
                hopeful, title, content = rows[keep], title[keep], content[keep]
                remaining = terms[essential:]
                for term, packed in cursor.execute(
                    BLOCK_STARTS_SQL, (collection_id, [t for t in remaining if t not in starts])
                ).fetchall():
                    starts[term] = np.frombuffer(packed, dtype=">i8").astype(np.int64)
                # The rest a term at a time, the most telling first: each adds its exact parts to the chunks
                # still hopeful, then the floor rises and the bound of what is left falls, so fewer chunks
                # remain to look up in the next (the most frequent terms, last, bound the least).
                for position, term in enumerate(remaining):
                    term_starts = starts.get(term, _NO_ROWS)
                    wanted = _holding_blocks(term_starts, hopeful)
                    if len(wanted) * BLOCK_LOOKUP_COST >= len(term_starts):
                        found = cursor.execute(POSTINGS_SQL, (collection_id, [term])).fetchall()
                    else:  # the blocks holding the hopeful chunks only
                        found = cursor.execute(
                            BLOCKS_SQL, ([term] * len(wanted), wanted.tolist(), collection_id)
                        ).fetchall()
                    read.append(_only(keyword_blocks.postings_of(found, index), hopeful))
                    later = [index[t] for t in remaining[position + 1 :]]
                    if not later:
                        break
                    term_rows, term_title, term_content = parts(read[-1])
                    at = np.searchsorted(hopeful, term_rows)
                    title[at] += term_title
                    content[at] += term_content
                    if len(hopeful) > top_k:
                        floor = _kth_largest(combine_parts(title, content, scoring), top_k)
                        rest_title, rest_content = bound(later)
                        keep = combine_parts(title + rest_title, content + rest_content, scoring) >= floor
                        hopeful, title, content = hopeful[keep], title[keep], content[keep]
                # Their exact scores, every term summed in the query's order.
                rows, title, content = parts(_only(_joined(read), hopeful))
                return rows, combine_parts(title, content, scoring)
        # Every term read whole: the unpruned ranking.
        rows, title, content = parts(_joined(read))
        return rows, combine_parts(title, content, scoring)

    @staticmethod
    def _filtered_chunk_rows(
        connection: Connection[Row], collection_id: str, metadata_filter: MetadataFilter | None
    ) -> set[int] | None:
        """The rows of the chunks whose document passes the filter; None without a filter."""
        if metadata_filter is None:
            return None
        where, parameters = to_sql(metadata_filter)
        statement = sql.SQL(
            "SELECT k.row_id FROM chunks k JOIN documents d "
            "ON d.collection_id = k.collection_id AND d.id = k.document_id "
            "WHERE k.collection_id = %(collection)s AND {}"
        ).format(where)
        rows = connection.execute(statement, {"collection": collection_id, **parameters}).fetchall()
        return {int(row["row_id"]) for row in rows}

    def term_document_counts(self, collection_id: str) -> dict[str, int]:
        """Every (stemmed) term of the collection's keyword index with the number of chunks holding it."""
        # keyword_terms' counts (a row per term: tens of thousands), as plain tuples.
        with self.connection().cursor(row_factory=tuple_row) as cursor:
            rows = cursor.execute(
                "SELECT term, chunks FROM keyword_terms WHERE collection_id = %s AND chunks > 0",
                (collection_id,),
            ).fetchall()
        return {term: int(chunks) for term, chunks in rows}

    def matching_document_ids(self, collection_id: str, metadata_filter: MetadataFilter) -> set[str]:
        """Ids of the collection's documents whose metadata passes the filter."""
        where, parameters = to_sql(metadata_filter)
        query = sql.SQL("SELECT d.id FROM documents d WHERE d.collection_id = %(collection)s AND {}").format(
            where
        )
        rows = self.connection().execute(query, {"collection": collection_id, **parameters}).fetchall()
        return {row["id"] for row in rows}

    def unknown_fields(self, collection_id: str, fields: list[str]) -> list[str]:
        """The fields that no document of the collection has in its metadata."""
        connection = self.connection()
        return [
            field
            for field in fields
            if connection.execute(
                "SELECT 1 FROM documents WHERE collection_id = %s AND metadata ? %s LIMIT 1",
                (collection_id, field),
            ).fetchone()
            is None
        ]

    def chunk_count(self, collection_id: str) -> int:
        """How many chunks a search over the collection considers."""
        row = (
            self.connection()
            .execute("SELECT chunks AS n FROM keyword_totals WHERE collection_id = %s", (collection_id,))
            .fetchone()
        )
        return int(row["n"]) if row else 0

    # Embedding cache
    def cached_embeddings(self, model: str, text_hashes: list[bytes]) -> dict[bytes, npt.NDArray[np.float32]]:
        """The cached vectors among the given text hashes."""
        if not text_hashes:
            return {}
        rows = (
            self.connection()
            .execute(
                "SELECT text_hash, vector FROM embedding_cache WHERE model = %s AND text_hash = ANY(%s)",
                (model, text_hashes),
            )
            .fetchall()
        )
        return {
            bytes(row["text_hash"]): np.frombuffer(bytes(row["vector"]), dtype=np.float32) for row in rows
        }

    def cache_embeddings(self, model: str, items: list[CacheItem]) -> None:
        """Remember vectors by text hash, each owned by the document it was made for (a first owner stays)."""
        if not items:
            return
        with self.transaction() as connection, connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO embedding_cache "
                "(model, text_hash, vector, collection_id, document_id, source_hash) "
                "VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (model, text_hash) DO UPDATE SET vector = EXCLUDED.vector",
                [
                    (model, h, np.ascontiguousarray(v, dtype=np.float32).tobytes(), *owner_columns(owner))
                    for h, v, owner in items
                ],
            )

    # Monitoring
    def record_call(self, record: CallRecord) -> None:
        """Append one call record."""
        self.connection().execute(
            f"INSERT INTO calls ({CALL_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                record.timestamp,
                record.tool,
                record.technique,
                record.duration_ms,
                record.success,
                record.error_code,
                record.principal,
                record.request_id,
                record.session_id,
            ),
        )

    def calls_since(self, since: float) -> list[CallRecord]:
        """Every call record at or after a UNIX time."""
        rows = (
            self.connection().execute("SELECT * FROM calls WHERE ts >= %s ORDER BY ts", (since,)).fetchall()
        )
        return [call_record(r) for r in rows]

    def call_totals(self, which: CallFilter, before: float | None = None) -> CallTotals:
        """Count, successes and durations' sum of the records a filter covers (and before a UNIX time)."""
        where, parameters = covered_calls(which, before, mark="%s")
        row = (
            self.connection()
            .execute(
                "SELECT COUNT(*) AS count, COUNT(*) FILTER (WHERE success) AS successes, "
                f"COALESCE(SUM(duration_ms), 0.0) AS duration_ms FROM calls WHERE {where}",
                parameters,
            )
            .fetchone()
        )
        assert row is not None  # an aggregate has one row
        return CallTotals(row["count"], row["successes"], row["duration_ms"])

    def call_figures(self, which: CallFilter) -> list[CallFigures]:
        """The figures of the call records a filter covers, in time order."""
        where, parameters = covered_calls(which, mark="%s")
        with self.connection().cursor(row_factory=tuple_row) as cursor:
            return cursor.execute(
                f"SELECT {CALL_FIGURE_COLUMNS} FROM calls WHERE {where} ORDER BY ts",
                parameters,
            ).fetchall()

    def recent_calls(self, which: CallFilter, limit: int) -> list[CallRecord]:
        """The latest call records a filter covers, newest first."""
        where, parameters = covered_calls(which, mark="%s")
        rows = self.connection().execute(
            f"SELECT * FROM calls WHERE {where} ORDER BY ts DESC LIMIT %s", [*parameters, limit]
        )
        return [call_record(r) for r in rows.fetchall()]

    def forget_calls_before(self, before: float) -> None:
        """Delete every call record before a UNIX time."""
        self.connection().execute("DELETE FROM calls WHERE ts < %s", (before,))

    def stats(self) -> dict[str, Any]:
        """Sizes and counts for health details (the URL without its password)."""
        counts = (
            self.connection()
            .execute(
                """SELECT (SELECT COUNT(*) FROM collections) AS collections,
                      (SELECT COUNT(*) FROM documents) AS documents,
                      (SELECT COUNT(*) FROM chunks) AS chunks,
                      pg_database_size(current_database()) AS database_bytes"""
            )
            .fetchone()
        )
        assert counts is not None
        pool = self._pool.get_stats()
        return {
            "backend": self.backend_name,
            "url": redact(self._url, with_pieces(url_userinfo(self._url)[1])),
            "collections": counts["collections"],
            "documents": counts["documents"],
            "chunks": counts["chunks"],
            "database_bytes": counts["database_bytes"],
            "pool_size": pool.get("pool_size", 0),
            "technique_indexes": {index.name: index.stats() for index in self._technique_indexes},
        }


def _chunk_values(
    collection_id: str,
    document: DocumentInput,
    chunk: ChunkInput,
    title_length: int,
    content_length: int,
    titled: bool,
) -> tuple[Any, ...]:
    """A chunks row after its row_id (collection_id ... titled), as both write paths insert it."""
    return (
        collection_id,
        document.id,
        chunk_id(document.id, chunk.index),
        chunk.index,
        chunk.content,
        chunk.start_char,
        chunk.end_char,
        Vector(np.asarray(chunk.vector, dtype=np.float32)),
        title_length,
        content_length,
        titled,
    )


def _count_chunk(
    totals: list[int],
    term_counts: dict[str, list[int]],
    titled: bool,
    title_terms: Counter[str],
    title_length: int,
    content_terms: Counter[str],
    content_length: int,
) -> set[str]:
    """Count one chunk into the keyword_totals and keyword_terms deltas; its terms."""
    terms = title_terms.keys() | content_terms.keys()
    _count_terms(term_counts, terms, title_terms, content_terms)
    totals[0] += 1
    totals[1] += int(titled)
    totals[2] += title_length
    totals[3] += content_length
    return terms


def _posting_values(
    collection_id: str,
    row_id: int,
    terms: set[str],
    title_terms: Counter[str],
    title_length: int,
    content_terms: Counter[str],
    content_length: int,
) -> list[Posting]:
    """The chunk's postings, in term order."""
    return [
        (collection_id, term, row_id, title_terms[term], content_terms[term], title_length, content_length)
        for term in sorted(terms)
    ]


def _count_terms(
    counts: dict[str, list[int]], terms: Iterable[str], title_terms: Counter[str], content_terms: Counter[str]
) -> None:
    """Count one chunk's terms into keyword_terms' deltas: the chunk, and the fields holding each."""
    for term in terms:
        counted = counts.setdefault(term, [0, 0, 0])
        counted[0] += 1
        counted[1] += int(title_terms[term] > 0)
        counted[2] += int(content_terms[term] > 0)


def _joined(parts: list[Postings]) -> Postings:
    """Postings read a term at a time, as one, in the query's term order (as postings_of orders them)."""
    parts = sorted((part for part in parts if len(part.term)), key=lambda part: int(part.term[0]))
    if not parts:
        return keyword_blocks.postings_of([], {})
    return Postings(*(np.concatenate([getattr(part, f.name) for part in parts]) for f in fields(Postings)))


_NO_ROWS = np.zeros(0, dtype=np.int64)
Floats = npt.NDArray[np.float64]


def _kth_largest(values: Floats, k: int) -> float:
    """The k-th largest of the values (at least k of them), without sorting them all."""
    return float(np.partition(values, len(values) - k)[len(values) - k])


def _only(postings: Postings, chunk_rows: npt.NDArray[np.int64]) -> Postings:
    """The postings of the given chunk rows (ascending, distinct)."""
    if not len(chunk_rows):
        keep = np.zeros(len(postings.chunk_row), dtype=bool)
    else:  # a binary search each: isin sorted both sides (30 ms for half a million postings)
        at = np.minimum(np.searchsorted(chunk_rows, postings.chunk_row), len(chunk_rows) - 1)
        keep = chunk_rows[at] == postings.chunk_row
    return Postings(*(getattr(postings, f.name)[keep] for f in fields(Postings)))


def _holding_blocks(
    starts: npt.NDArray[np.int64], chunk_rows: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The first rows of the blocks (starting at `starts`, ascending) that may hold the given chunk rows."""
    at = np.searchsorted(starts, chunk_rows, side="right") - 1
    return np.unique(starts[at[at >= 0]])


_CHUNK_SELECT = """
    SELECT k.chunk_id, k.document_id, k.chunk_index, k.content, k.start_char, k.end_char, d.title, d.metadata
    FROM chunks k JOIN documents d ON d.collection_id = k.collection_id AND d.id = k.document_id"""
_COLLECTION_SELECT = """
    SELECT c.*,
           -- kept in step by every write: counting the chunks took a millisecond per call at 5,000, the
           -- documents 10-160 ms at 50,000
           COALESCE((SELECT t.documents FROM keyword_totals t WHERE t.collection_id = c.id), 0)
               AS document_count,
           COALESCE((SELECT t.chunks FROM keyword_totals t WHERE t.collection_id = c.id), 0) AS chunk_count,
           COALESCE((SELECT v.version FROM collection_versions v WHERE v.collection_id = c.id), 0) AS version
    FROM collections c"""

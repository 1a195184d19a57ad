"""The store contract every backend implements (iris_rag/backends/: SQLite, PostgreSQL and IRIS).

No driver type appears here: a backend keeps its connections to itself, compiles keyword queries and
metadata filters to its own dialect, and stores each technique's rows through the storage contract the
technique declares (technique_storage).
"""

from __future__ import annotations

import hashlib
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from iris_rag.errors import EmbeddingMismatchError, InvalidParametersError
from iris_rag.stores.filters import MetadataFilter

if TYPE_CHECKING:
    from iris_rag.stores.technique_index import TechniqueIndex

# flat: one BM25 over title and content together (one document length). multifield: each field's own BM25
# (own IDF and length normalization), combined as best field + 0.5 x the other (Elasticsearch best_fields).
KeywordScoring = Literal["flat", "multifield"]
MULTIFIELD_OTHER_SHARE = 0.5

# BM25 as every backend scores it: SQLite FTS5's bm25(), which the others compute alike from their postings.
# A term in half the chunks or more has ln((N - n + 0.5) / (n + 0.5)) <= 0; FTS5 gives it this IDF instead.
BM25_K1 = 1.2
BM25_B = 0.75
BM25_IDF_FLOOR = 1e-6

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class KeywordQuery:
    """A keyword (BM25) search as data; each backend compiles it to its own full-text syntax.

    terms: lowercase query terms, or indexed stems from a fuzzy repair, each with how many times it counts
    (a weight of 2 adds the term's BM25 contribution twice). No term is ever parsed as syntax.
    title_weight multiplies the title field's contribution; scoring picks flat or multifield BM25.
    """

    terms: dict[str, int]
    title_weight: float = 1.0
    scoring: KeywordScoring = "flat"

    @classmethod
    def of(
        cls, terms: list[str], title_weight: float = 1.0, scoring: KeywordScoring = "flat"
    ) -> KeywordQuery:
        """Every term once."""
        return cls(dict.fromkeys(terms, 1), title_weight, scoring)

    def floor_score(self) -> float:
        """The most a chunk scores when only terms held by half the chunks or more match it.

        Each such term adds at most its floored IDF times k1 + 1 (the term-frequency part's limit; flat BM25
        weighs the title inside it), per field under multifield, whose title score is scaled by title_weight.
        A score this low is no evidence, yet divided by the best such score it would weigh as much as a real
        match.
        """
        fields = 1.0
        if self.scoring == "multifield":
            fields = (1 + MULTIFIELD_OTHER_SHARE) * max(1.0, self.title_weight)
        return BM25_IDF_FLOOR * (BM25_K1 + 1) * sum(self.terms.values()) * fields

    def with_evidence(self, hits: list[ScoredChunk]) -> list[ScoredChunk]:
        """The hits some term held by fewer than half the chunks matched (score above floor_score)."""
        floor = self.floor_score()
        return [hit for hit in hits if hit.score > floor]


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    """A collection and the embedding model its vectors were made with."""

    id: str
    embedding_model: str
    dimension: int
    document_count: int = 0
    chunk_count: int = 0
    created_at: str = ""
    updated_at: str = ""
    description: str = ""
    # The data version when this was read (DocumentStore.data_version): caches of derived state key on it.
    version: int = 0


@dataclass(frozen=True, slots=True)
class NewCollection:
    """What a collection is created with, by the same transaction as its first documents."""

    embedding_model: str
    dimension: int


@dataclass(frozen=True, slots=True)
class ChunkInput:
    """A chunk ready to store: its text, offsets and vector."""

    index: int
    content: str
    start_char: int
    end_char: int
    vector: npt.NDArray[np.float32]
    # A technique index's token-level encoding of the chunk, when the ingest's one forward pass already
    # made it (see indexes.base.ChunkEncodingSource); None: the index encodes the chunk itself.
    tokens: Any = None


@dataclass(frozen=True, slots=True)
class DocumentInput:
    """A document ready to store, with its chunks."""

    id: str
    title: str
    content: str
    metadata: dict[str, Any]
    chunks: list[ChunkInput]


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk read back, with what a retrieved document needs of its parent."""

    chunk_id: str
    document_id: str
    index: int
    content: str
    start_char: int
    end_char: int
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StoredDocument:
    """A document read back."""

    id: str
    collection_id: str
    title: str
    content: str
    metadata: dict[str, Any]
    created_at: str
    updated_at: str


@dataclass(frozen=True, slots=True)
class DocumentSummary:
    """A document as a listing shows it: no text, its size."""

    id: str
    title: str
    chars: int
    chunks: int
    created_at: str
    updated_at: str


@dataclass(frozen=True, slots=True)
class ScoredChunk:
    """A search hit: which chunk and how well it matched."""

    chunk_id: str
    score: float


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One served call, as the monitor stores it."""

    timestamp: float
    tool: str
    technique: str | None
    duration_ms: float
    success: bool
    error_code: str | None
    principal: str | None = None  # the HTTP caller's id; None for the local user (stdio, CLI)
    request_id: str | None = None  # the caller's ids for the call and its session (optional on every tool)
    session_id: str | None = None


# The columns of a call record rag_metrics' figures read: timestamp, tool, technique, duration_ms, success
# (SQLite's 0/1 or a bool), error_code, principal; not the caller's ids, which only recent_calls shows.
CallFigures = tuple[float, str, str | None, float, int, str | None, str | None]


@dataclass(frozen=True, slots=True)
class CallFilter:
    """Which call records a metrics read covers: from a UNIX time, of some techniques, of one caller."""

    since: float
    techniques: list[str] | None = None  # None: every record, those of no technique included
    principal: str | None = None  # None: everyone's


@dataclass(frozen=True, slots=True)
class CallTotals:
    """Health's figures of a run of call records, summed by the store."""

    count: int
    successes: int
    duration_ms: float  # the durations' sum


class Collections(Protocol):
    """The collections of a store."""

    def get_collection(self, collection_id: str) -> CollectionInfo | None:
        """The collection with counts, or None."""

    def create_collection(self, collection_id: str, embedding_model: str, dimension: int) -> CollectionInfo:
        """Create the collection if absent and return it."""

    def list_collections(self) -> list[CollectionInfo]:
        """Every collection with counts."""

    def set_description(self, collection_id: str, description: str) -> CollectionInfo | None:
        """Set the collection's description; None if there is no such collection."""


class Documents(Protocol):
    """Documents and their chunks; every write is one transaction with every technique's rows."""

    def upsert_documents(
        self,
        collection_id: str,
        documents: list[DocumentInput],
        prepared: dict[str, Any] | None = None,
        *,
        new_collection: NewCollection | None = None,
    ) -> int:
        """Insert or replace documents, chunks and technique-index rows in one transaction; count chunks.

        With `new_collection`, a missing collection is created in that same transaction. A replaced
        document's cached vectors made for other text than the new one's go (EmbeddingCache).
        """

    def register_index(self, index: TechniqueIndex) -> None:
        """Keep a technique's index in step with every later upsert and delete."""

    def technique_storage(self, contract: type[T]) -> T:
        """The backend's implementation of a technique's storage contract (techniques/<t>/storage.py).

        Its writes, when TechniqueIndex.write or delete calls them, join the store's open transaction.
        """

    def index_transaction(
        self, collection_id: str, document_ids: list[str]
    ) -> AbstractContextManager[object]:
        """A transaction adding technique-index rows for documents committed before (built in the background).

        It waits for the collection's other writers (an upsert or delete of the same collection commits
        wholly before or after it), so a document read inside it is the one the rows will sit beside; on
        commit it moves the collection's data version on, as a change to those documents, so every cache
        keyed on the version (a technique's loaded index) sees the new rows. `document_ids`: the documents
        whose rows the block writes, read when the block ends (so the block may narrow the list).
        """

    def collection_transaction(self, collection_id: str) -> AbstractContextManager[object]:
        """A write transaction that first waits for the collection's other writers (as index_transaction).

        A document read inside is the one the block's writes (upserts, deletes, joining it) replace: a
        writer that must find documents as it read them earlier (reindex, sync) checks them here.
        """

    def delete_document(self, collection_id: str, document_id: str) -> bool:
        """Delete a document, its chunks and its cached vectors; False if it was absent."""

    def delete_collection(self, collection_id: str) -> int | None:
        """Delete the collection with its documents and every technique's rows, in one transaction.

        Its cached vectors go too (EmbeddingCache). Returns how many documents went, or None if there was
        no such collection.
        """

    def get_document(self, collection_id: str, document_id: str) -> StoredDocument | None:
        """One document, or None."""

    def document_ids(self, collection_id: str) -> list[str]:
        """Every document id of the collection, in insertion order."""

    def list_documents(self, collection_id: str, offset: int, limit: int) -> list[DocumentSummary]:
        """A page of the collection's documents, in insertion order."""

    def get_document_chunks(self, collection_id: str, document_id: str) -> list[StoredChunk]:
        """A document's chunks in order."""

    def get_chunks(self, collection_id: str, chunk_ids: list[str]) -> list[StoredChunk]:
        """Chunks by id, in the order asked (unknown ids are skipped)."""

    def data_version(self, collection_id: str) -> int:
        """The collection's data version, moved on by every write or delete of its documents (any process).

        Caches of derived state (stores.versioned) key on it; reading it is one cheap query.
        """

    def changed_documents(self, collection_id: str, since: int, through: int, limit: int) -> set[str] | None:
        """The documents written or deleted in the collection's versions after `since`, through `through`.

        Changes past `through` may be named too (newer data, as good for a cache brought up to date). None
        when the store cannot tell: its change log lacks a version of the span (pruned, written by an older
        schema, no log in this backend) or more than `limit` documents changed; the caller then reloads.
        """

    def read_snapshot(self) -> AbstractContextManager[None]:
        """Reads on this thread inside see one state of the collection's rows (joins an open transaction).

        For derived state read in several queries that must agree with each other (stores.versioned).
        """

    def matching_document_ids(self, collection_id: str, metadata_filter: MetadataFilter) -> set[str]:
        """Ids of the documents whose metadata passes the filter."""

    def unknown_fields(self, collection_id: str, fields: list[str]) -> list[str]:
        """The fields no document of the collection has in its metadata."""

    def chunk_count(self, collection_id: str) -> int:
        """How many chunks a search over the collection considers."""


class DenseSearch(Protocol):
    """Cosine search over the chunks' vectors."""

    def vector_search(
        self,
        collection_id: str,
        query_vector: npt.NDArray[np.float32],
        top_k: int,
        metadata_filter: MetadataFilter | None = None,
    ) -> list[ScoredChunk]:
        """The top_k chunks by cosine similarity, best first, among documents passing the filter.

        Exact, or through an approximate index whose recall the contract suite holds at 0.95 or more.
        """

    def vector_scores(
        self, collection_id: str, query_vector: npt.NDArray[np.float32], chunk_ids: list[str]
    ) -> dict[str, float]:
        """Exact cosine similarity of the given chunks."""

    def chunk_vectors(self, collection_id: str, chunk_ids: list[str]) -> dict[str, npt.NDArray[np.float32]]:
        """The stored vectors of the given chunks, verbatim (unknown ids are left out; `iris-rag migrate`)."""


class KeywordSearch(Protocol):
    """BM25 over the chunks' terms; queries are data (KeywordQuery) each backend compiles."""

    def keyword_search(
        self,
        collection_id: str,
        query: KeywordQuery,
        top_k: int,
        metadata_filter: MetadataFilter | None = None,
    ) -> list[ScoredChunk]:
        """The top_k chunks by BM25 for the query's terms (FTS5 in SQLite, full-text search elsewhere)."""

    def term_document_counts(self, collection_id: str) -> dict[str, int]:
        """The keyword index's (stemmed) terms with how many chunks hold each."""


@dataclass(frozen=True, slots=True)
class CacheOwner:
    """The document a cached vector was made for, with the hash of its title and content then.

    Deleting the document or its collection deletes the vectors it owns; replacing it with other text
    deletes those made for the old text (their source_hash differs): the cache holds what the store holds.
    """

    collection_id: str
    document_id: str
    source_hash: bytes

    @classmethod
    def of(cls, collection_id: str, document: DocumentInput) -> CacheOwner:
        """The owner of the vectors made for this document's texts (chunks, sentences, names)."""
        return cls(collection_id, document.id, document_source(document.title, document.content))


def cache_key(text: str, collection_id: str = "") -> bytes:
    """The embedding cache's key for a text: shared by every collection, or one collection's own.

    Texts hold no NUL (dropped at ingest), so the two kinds never meet.
    """
    prefix = f"{collection_id}\x00" if collection_id else ""
    return hashlib.sha256(f"{prefix}{text}".encode()).digest()[:16]


def document_source(title: str, content: str) -> bytes:
    """The hash of a document's title and content: every text the cache holds for it derives from them."""
    text = f"{title}\x00{content}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(text).digest()[:16]


def owner_columns(owner: CacheOwner | None) -> tuple[str | None, str | None, bytes | None]:
    """A cached vector's owner as its row stores it: collection_id, document_id, source_hash (NULL: none)."""
    return (
        (None, None, None) if owner is None else (owner.collection_id, owner.document_id, owner.source_hash)
    )


# A vector to remember: its text's hash, the vector, and its owner (None: no document's, kept until cleared).
CacheItem = tuple[bytes, npt.NDArray[np.float32], CacheOwner | None]


class EmbeddingCache(Protocol):
    """Vectors remembered by the hash of the text they encode, per model, each owned by its document.

    A vector is owned by the document it was made for (CacheOwner): Documents.delete_document,
    delete_collection and an upsert replacing the document with other text delete it. One row per text:
    a text already cached keeps its first owner, so deleting an owner's vectors may take one that another
    document (or collection) holding the same text also read: a cache miss only costs embedding it again.
    """

    def cached_embeddings(self, model: str, text_hashes: list[bytes]) -> dict[bytes, npt.NDArray[np.float32]]:
        """The cached vectors among the given text hashes."""

    def cache_embeddings(self, model: str, items: list[CacheItem]) -> None:
        """Remember vectors by text hash, each owned by the document it was made for."""


class CallLog(Protocol):
    """The monitor's call records."""

    def record_call(self, record: CallRecord) -> None:
        """Append one call record."""

    def calls_since(self, since: float) -> list[CallRecord]:
        """Every call record at or after a UNIX time."""

    def call_totals(self, which: CallFilter, before: float | None = None) -> CallTotals:
        """Count, successes and durations' sum of the records a filter covers (and before a UNIX time)."""

    def call_figures(self, which: CallFilter) -> list[CallFigures]:
        """The figures of the call records a filter covers, in time order."""

    def recent_calls(self, which: CallFilter, limit: int) -> list[CallRecord]:
        """The latest call records a filter covers, newest first."""

    def forget_calls_before(self, before: float) -> None:
        """Delete every call record before a UNIX time."""


class DocumentStore(Collections, Documents, DenseSearch, KeywordSearch, EmbeddingCache, CallLog, Protocol):
    """A whole store: what the service hands pipelines and ingestion (each part above is its own contract)."""

    backend_name: str

    def transaction(self) -> AbstractContextManager[object]:
        """One write transaction: every store write inside it commits together or not at all.

        Writes open one of their own when none is open (upsert_documents, delete_document); inside one
        they join it, technique storage included.
        """

    def ping(self) -> None:
        """Run a trivial query; raise if the store is unreachable."""

    def close(self) -> None:
        """Release connections."""

    def stats(self) -> dict[str, Any]:
        """Sizes and counts for health details."""


COLLECTION_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")  # as common.json#/$defs/collection_id


def check_collection_id(collection_id: str) -> None:
    """A new collection's id is what the tools' schema allows (the CLI's paths have no schema before them)."""
    if not COLLECTION_ID.match(collection_id):
        msg = f"collection id {collection_id!r} must be 1-64 letters, digits, '_', '.', '-'"
        raise InvalidParametersError(msg)


def check_embedding_model(collection: CollectionInfo, model_name: str) -> None:
    """Vectors from two models are not comparable: refuse rather than return nonsense."""
    if collection.embedding_model != model_name:
        msg = (
            f"collection {collection.id!r} was built with embedding model {collection.embedding_model!r} "
            f"({collection.dimension} dimensions) but the server is configured with {model_name!r}; "
            "set EMBEDDING_MODEL to the collection's model or ingest into a new collection"
        )
        raise EmbeddingMismatchError(
            msg,
            {
                "collection_model": collection.embedding_model,
                "configured_model": model_name,
                "collection_dimension": collection.dimension,
            },
        )

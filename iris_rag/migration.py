"""`iris-rag migrate`: copy collections from one store to another, vectors verbatim, nothing re-embedded.

Everything goes through the store contract (iris_rag/stores/base.py) and the techniques' storage contracts,
so any backend can be a source or a target: documents with their metadata, chunks with their offsets and
stored vectors, and every technique's rows (ColBERT's token codes and word-piece frequencies, NodeRAG's
trees with their leaf vectors, GraphRAG's graph with its entity-name vectors, SQL-RAG's documents view).
Each collection is copied in one transaction of the target: it appears whole or not at all. A collection
the target already holds is refused unless `replace` is asked for, and then it is replaced in that same
transaction. A target with a bulk write path (PostgreSQL: COPY, the HNSW index built once after the rows)
takes the copy through it. Structured tables (rag_ingest_table's) are not copied: replacing a collection
drops the target's, and its summary names them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
from pydantic import SecretStr

from iris_rag.backends import create_store
from iris_rag.cancellation import check_cancelled
from iris_rag.errors import CollectionNotFoundError, InvalidParametersError
from iris_rag.redaction import redact
from iris_rag.settings import Settings
from iris_rag.stores.base import ChunkInput, DocumentInput, DocumentStore, NewCollection
from iris_rag.techniques.colbert.storage import TokenVectorStorage
from iris_rag.techniques.graphrag.storage import (
    AliasRow,
    GraphWrite,
    KnowledgeGraphStorage,
    MentionRow,
    NewEvidence,
    NewRelation,
)
from iris_rag.techniques.noderag.storage import NodeTreeStorage
from iris_rag.techniques.sqlrag.storage import StructuredTableStorage
from iris_rag.techniques.sqlrag.tables import ensure_view

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Documents read, and written, per step: bounds memory on large collections.
BATCH = 256


@runtime_checkable
class BulkLoading(Protocol):
    """A store with a bulk write path: one transaction in which every upsert is a bulk write."""

    def bulk_load(self) -> AbstractContextManager[Any]:
        """The transaction (PostgresStore.bulk_load)."""
        ...


@runtime_checkable
class Identifiable(Protocol):
    """A store whose server tells whether another opened store is the same one."""

    def same_store_as(self, other: object) -> bool:
        """PostgresStore.same_store_as."""
        ...


def _load_transaction(target: DocumentStore) -> AbstractContextManager[Any]:
    """The target's bulk load where it has one, else its plain transaction."""
    return target.bulk_load() if isinstance(target, BulkLoading) else target.transaction()


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """Where a store is: `sqlite:PATH`, `postgres:URL` (or a bare postgresql:// URL), or `iris:` (IRIS_*)."""

    backend: str
    location: str  # the SQLite file, the PostgreSQL URL, or "" for IRIS from its environment variables

    @classmethod
    def parse(cls, text: str) -> StoreSpec:
        """Read a store's spec; InvalidParametersError names the accepted forms."""
        if text.startswith(("postgresql://", "postgres://")):
            return cls("postgres", text)
        backend, _, location = text.partition(":")
        if backend == "sqlite" and location:
            path = Path(location).expanduser()
            return cls("sqlite", str(path if _names_the_file(location, path) else path / _SQLITE_FILE))
        if backend == "postgres" and location.startswith(("postgresql://", "postgres://")):
            return cls("postgres", location)
        if backend == "iris" and location in ("", "env"):
            return cls("iris", "")
        msg = (
            f"unknown store {redact(text)!r}: use sqlite:PATH (the .sqlite3 file or its RAG_DATA_DIR "
            "folder), "
            "postgres:postgresql://user:password@host:5432/db, or iris: (the IRIS_* environment variables)"
        )
        raise InvalidParametersError(msg, {"store": redact(text)})

    def same_store(self, other: StoreSpec) -> bool:
        """Whether both name one store, however spelled.

        SQLite: the same file, through relative paths and symlinks; PostgreSQL: the same host, port and
        database, whoever logs in; IRIS: both the IRIS_* variables' server.
        """
        if self.backend != other.backend:
            return False
        if self.backend == "sqlite":
            mine, theirs = Path(self.location), Path(other.location)
            if mine.exists() and theirs.exists():
                return mine.samefile(theirs)  # hard links too
            return mine.resolve() == theirs.resolve()
        if self.backend == "postgres":
            try:
                from iris_rag.backends.postgres.store import database_identity  # the postgres extra
            except ImportError:  # no driver: only an identical spelling is the same
                return self.location == other.location
            return database_identity(self.location) == database_identity(other.location)
        return True

    def describe(self) -> str:
        """The spec without secrets, for messages."""
        return f"{self.backend}:{redact(self.location)}" if self.location else f"{self.backend}:"

    def open(self, settings: Settings, *, must_exist: bool) -> DocumentStore:
        """The store, made by the one factory (backends.create_store) from settings pointed at it."""
        if self.backend == "sqlite":
            path = Path(self.location)
            if must_exist and not path.is_file():
                msg = f"no SQLite store at {path}"
                raise InvalidParametersError(msg, {"store": self.describe()})
            update: dict[str, Any] = {"store": "sqlite", "data_dir": path.parent}
            opened = settings.model_copy(update=update)
            # The factory names the file in the folder; a spec may name any file.
            from iris_rag.backends.sqlite.store import SqliteStore

            return SqliteStore(path) if path.name != opened.database_path.name else create_store(opened)
        if self.backend == "postgres":
            update = {"store": "postgres", "postgres_url": SecretStr(self.location)}
            return create_store(settings.model_copy(update=update))
        if not (settings.iris_host and settings.iris_host.strip()):
            msg = "iris: names the IRIS server of the IRIS_* variables, and IRIS_HOST is not set"
            raise InvalidParametersError(msg, {"store": self.describe()})
        return create_store(settings.model_copy(update={"store": self.backend}))


_SQLITE_FILE = "iris_rag.sqlite3"  # the store's file in a RAG_DATA_DIR (Settings.database_path)

# Endings that name a SQLite file itself; any other path that is not a file already is a data folder.
_SQLITE_SUFFIXES = (".sqlite3", ".sqlite", ".db")


def _names_the_file(location: str, path: Path) -> bool:
    """sqlite:PATH names the store's file (else a RAG_DATA_DIR folder, made if it does not exist yet).

    An existing file, or a name ending in .sqlite3, .sqlite or .db, not followed by a slash.
    """
    if location.endswith(("/", "\\")) or path.is_dir():
        return False
    return path.is_file() or path.suffix.lower() in _SQLITE_SUFFIXES


@dataclass
class CollectionCopy:
    """What one collection's copy moved."""

    collection: str
    documents: int = 0
    chunks: int = 0
    replaced: bool = False
    techniques: dict[str, int] = field(default_factory=dict)
    # The replaced collection's structured tables (rag_ingest_table) in the target: dropped, none copied.
    dropped_tables: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The summary the command prints."""
        return {
            "collection": self.collection,
            "documents": self.documents,
            "chunks": self.chunks,
            "replaced": self.replaced,
            "techniques": self.techniques,
            "dropped_tables": self.dropped_tables,
        }


def migrate(
    source: DocumentStore,
    target: DocumentStore,
    collections: list[str] | None = None,
    *,
    replace: bool = False,
    skip: frozenset[str] = frozenset(),
    progress: Callable[[str, int], None] | None = None,
) -> list[CollectionCopy]:
    """Copy the named collections (all when None) from source to target, each in one target transaction.

    Every collection is checked before any is written: a missing source collection, one the target
    already holds while replace is False, or technique rows the target cannot store (unless that technique
    is in `skip`: its rows stay behind, and it answers INDEX_NOT_BUILT there until a reindex) refuse the
    whole run. So does a target that is the source, however its server was reached (replace would delete
    the collection it copies).
    """
    if source is target or (isinstance(source, Identifiable) and source.same_store_as(target)):
        msg = "the source and the target are the same store, reached at two addresses: nothing was copied"
        raise InvalidParametersError(msg)
    unknown = sorted(skip - _CONTRACTS.keys())
    if unknown:
        msg = f"unknown techniques to skip {unknown}; techniques with rows: {', '.join(_CONTRACTS)}"
        raise InvalidParametersError(msg)
    names = collections if collections is not None else [c.id for c in source.list_collections()]
    missing = [name for name in names if source.get_collection(name) is None]
    if missing:
        msg = f"the source store has no collection {', '.join(map(repr, missing))}"
        raise CollectionNotFoundError(msg, {"collections": missing})
    for name in names:
        lacking = [
            t
            for t in _techniques_with_rows(source, name)
            if t not in skip and _storage(target, _CONTRACTS[t]) is None
        ]
        if lacking:
            msg = (
                f"collection {name!r} has {', '.join(lacking)} rows that the {target.backend_name} store "
                "cannot hold yet: nothing was copied "
                f"(--skip-technique {','.join(lacking)} leaves them behind)"
            )
            raise InvalidParametersError(msg, {"collection": name, "techniques": lacking})
    present = [name for name in names if target.get_collection(name) is not None]
    if present and not replace:
        msg = (
            f"the target store already holds {', '.join(map(repr, present))}: nothing was copied; "
            "pass --replace to overwrite (each replaced collection is deleted and copied in one transaction)"
        )
        raise InvalidParametersError(msg, {"collections": present})
    return [_copy_collection(source, target, name, name in present, skip, progress) for name in names]


def _copy_collection(
    source: DocumentStore,
    target: DocumentStore,
    collection_id: str,
    replace: bool,
    skip: frozenset[str],
    progress: Callable[[str, int], None] | None,
) -> CollectionCopy:
    info = source.get_collection(collection_id)
    assert info is not None
    report = CollectionCopy(collection_id, replaced=replace)
    document_ids = source.document_ids(collection_id)
    with _load_transaction(target):
        if replace:
            report.dropped_tables = _structured_tables(target, collection_id)
            if report.dropped_tables:
                logger.warning(
                    "replacing %r drops its structured tables in the target (%s): migrate does not copy "
                    "structured tables; ingest them again (rag_ingest_table)",
                    collection_id,
                    ", ".join(report.dropped_tables),
                )
            _drop_technique_rows(target, collection_id)
            target.delete_collection(collection_id)
        new = NewCollection(info.embedding_model, info.dimension)
        target.create_collection(collection_id, info.embedding_model, info.dimension)
        for start in range(0, len(document_ids), BATCH):
            check_cancelled()
            batch = _read_documents(
                source, collection_id, document_ids[start : start + BATCH], info.dimension
            )
            report.chunks += target.upsert_documents(collection_id, batch, new_collection=new)
            report.documents += len(batch)
            if progress is not None:
                progress(collection_id, len(batch))
        if info.description:
            target.set_description(collection_id, info.description)
        report.techniques = _copy_technique_rows(source, target, collection_id, document_ids, skip)
    return report


def _read_documents(
    source: DocumentStore, collection_id: str, document_ids: list[str], dimension: int
) -> list[DocumentInput]:
    """The documents with their chunks and stored vectors, ready to write as read."""
    documents: list[DocumentInput] = []
    for document_id in document_ids:
        # One snapshot a document: a source written to meanwhile never gives one half old, half new.
        with source.read_snapshot():
            document = source.get_document(collection_id, document_id)
            if document is None:  # deleted while copying: the source moved on
                continue
            chunks = source.get_document_chunks(collection_id, document_id)
            vectors = source.chunk_vectors(collection_id, [c.chunk_id for c in chunks])
        lost = [c.chunk_id for c in chunks if c.chunk_id not in vectors]
        if lost or any(v.shape != (dimension,) for v in vectors.values()):
            msg = f"document {document_id!r} of {collection_id!r} has chunks without a stored vector"
            raise InvalidParametersError(msg, {"document_id": document_id, "chunks": lost})
        documents.append(
            DocumentInput(
                id=document.id,
                title=document.title,
                content=document.content,
                metadata=document.metadata,
                chunks=[
                    ChunkInput(c.index, c.content, c.start_char, c.end_char, vectors[c.chunk_id])
                    for c in chunks
                ],
            )
        )
    return documents


_CONTRACTS: dict[str, type[Any]] = {
    "colbert": TokenVectorStorage,
    "noderag": NodeTreeStorage,
    "graphrag": KnowledgeGraphStorage,
    "sqlrag": StructuredTableStorage,
}


def _storage(store: DocumentStore, contract: type[T]) -> T | None:
    """The store's storage for a technique, or None where the backend has none yet."""
    try:
        return store.technique_storage(contract)
    except NotImplementedError:
        return None


def _techniques_with_rows(source: DocumentStore, collection_id: str) -> list[str]:
    """The techniques that hold rows (or, for sqlrag, a documents view) for the collection in the source."""
    found = []
    tokens = _storage(source, TokenVectorStorage)
    if tokens is not None and tokens.indexed_documents(collection_id):
        found.append("colbert")
    trees = _storage(source, NodeTreeStorage)
    if trees is not None and trees.indexed_documents(collection_id):
        found.append("noderag")
    graph = _storage(source, KnowledgeGraphStorage)
    if graph is not None and graph.graph_record(collection_id) is not None:
        found.append("graphrag")
    tables = _storage(source, StructuredTableStorage)
    if tables is not None and tables.view_for(collection_id) is not None:
        found.append("sqlrag")
    return found


def _structured_tables(store: DocumentStore, collection_id: str) -> list[str]:
    """The collection's structured tables (rag_ingest_table's; not its documents view) in the store."""
    tables = _storage(store, StructuredTableStorage)
    if tables is None:
        return []
    return [t.name for t in tables.list_tables() if t.kind == "table" and t.collection_id == collection_id]


def _drop_technique_rows(target: DocumentStore, collection_id: str) -> None:
    """A replaced collection's technique rows (the target store runs no technique index to drop them)."""
    tokens = _storage(target, TokenVectorStorage)
    trees = _storage(target, NodeTreeStorage)
    for document_id in target.document_ids(collection_id):
        if tokens is not None:
            tokens.delete_document(collection_id, document_id)
        if trees is not None:
            trees.delete_document(collection_id, document_id)
    if tokens is not None:
        _, frequencies = tokens.frequencies(collection_id)
        if frequencies:
            tokens.add_frequencies(collection_id, {piece: -count for piece, count in frequencies.items()})
    if (graph := _storage(target, KnowledgeGraphStorage)) is not None:
        graph.drop_collection(collection_id)
    if (tables := _storage(target, StructuredTableStorage)) is not None:
        tables.drop_collection(collection_id)


def _copy_technique_rows(
    source: DocumentStore,
    target: DocumentStore,
    collection_id: str,
    document_ids: list[str],
    skip: frozenset[str],
) -> dict[str, int]:
    """Each technique's rows of the collection, through its storage contract; documents indexed by each.

    migrate() has checked that the target has a storage for every technique with rows in the source.
    """
    copied: dict[str, int] = {}
    techniques = [t for t in _techniques_with_rows(source, collection_id) if t not in skip]
    if "colbert" in techniques:
        # Token codes per chunk, and the word-piece document frequencies behind the query-side IDF.
        source_tokens = source.technique_storage(TokenVectorStorage)
        target_tokens = target.technique_storage(TokenVectorStorage)
        chunk_ids = [c.chunk_id for d in document_ids for c in source.get_document_chunks(collection_id, d)]
        position = {chunk: i for i, chunk in enumerate(chunk_ids)}
        for start in range(0, len(chunk_ids), BATCH * 4):
            rows = source_tokens.load(collection_id, chunk_ids[start : start + BATCH * 4])
            if rows:  # in the chunks' order, as the ingest wrote them
                target_tokens.insert(collection_id, sorted(rows, key=lambda r: position[r.chunk_id]))
        _, frequencies = source_tokens.frequencies(collection_id)
        if frequencies:
            target_tokens.add_frequencies(collection_id, frequencies)
        copied["colbert"] = target_tokens.indexed_documents(collection_id)
    if "noderag" in techniques:
        # Each document's tree with its leaf vectors.
        source_trees = source.technique_storage(NodeTreeStorage)
        target_trees = target.technique_storage(NodeTreeStorage)
        for start in range(0, len(document_ids), BATCH):
            batch = document_ids[start : start + BATCH]
            trees = source_trees.document_trees(collection_id, batch)
            if trees:  # in the documents' order: leaves() gives them back in the order written
                target_trees.write_trees(collection_id, [trees[d] for d in batch if d in trees])
        copied["noderag"] = target_trees.indexed_documents(collection_id)
    if "graphrag" in techniques:
        copied["graphrag"] = _copy_graph(
            source.technique_storage(KnowledgeGraphStorage),
            target.technique_storage(KnowledgeGraphStorage),
            collection_id,
        )
    if "sqlrag" in techniques:
        # The documents view reads the documents themselves: it is made again over the copied ones.
        ensure_view(target.technique_storage(StructuredTableStorage), collection_id)
        copied["sqlrag"] = len(document_ids)
    return copied


def _copy_graph(source: KnowledgeGraphStorage, target: KnowledgeGraphStorage, collection_id: str) -> int:
    """The collection's knowledge graph, entity ids mapped to the target's; name vectors copied as stored."""
    record = source.graph_record(collection_id)
    if record is None:
        return 0
    entities = source.entities(collection_id, min_documents=0)
    made = target.ensure_entities(collection_id, {e.row.key: (e.row.name, e.row.type) for e in entities})
    new_id = {key.key: key.id for key in made}
    id_of = {e.row.id: new_id[e.row.key] for e in entities}
    vectors = [(id_of[e.row.id], _floats(e.vector)) for e in entities if e.vector is not None]
    if vectors:
        target.set_entity_vectors(vectors)
    old_ids = [e.row.id for e in entities]
    relations = sorted(source.relations_of(collection_id, old_ids), key=lambda r: r.id)
    evidence: dict[int, list[NewEvidence]] = {}
    for row in source.evidence_of([r.id for r in relations]):
        evidence.setdefault(row.relation_id, []).append(
            NewEvidence(row.document_id, row.chunk_id, row.count, row.field, row.start_char, row.end_char)
        )
    write = GraphWrite(
        mentions=[
            MentionRow(id_of[m.entity_id], m.document_id, m.chunk_id, m.field, m.start_char, m.end_char)
            for m in source.mentions_of(old_ids)
        ],
        counts={id_of[e.row.id]: (e.row.mention_count, e.row.document_count) for e in entities},
        relations=[
            NewRelation(id_of[r.source_id], id_of[r.target_id], r.type, r.weight, evidence.get(r.id, []))
            for r in relations
        ],
        aliases=[
            AliasRow(a.alias, id_of[a.entity_id], a.document_id, a.surface)
            for a in source.alias_rows(collection_id)
        ],
        documents=source.graph_documents(collection_id),
    )
    target.add(collection_id, write)
    target.record(collection_id, record.extractor, record.llm_model, record.updated_at or "")
    return target.indexed_documents(collection_id)


def _floats(vector: bytes) -> npt.NDArray[np.float32]:
    return np.frombuffer(vector, dtype=np.float32).copy()


@contextmanager
def opened(spec: StoreSpec, settings: Settings, *, must_exist: bool) -> Iterator[DocumentStore]:
    """The store for the length of the block, closed after."""
    store = spec.open(settings, must_exist=must_exist)
    try:
        yield store
    finally:
        store.close()

"""Ingestion: check, chunk, embed and store documents; one bad document never stops the others."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from iris_rag import access, progress
from iris_rag.cancellation import check_cancelled
from iris_rag.encoder import TextEncoder
from iris_rag.errors import InvalidParametersError
from iris_rag.ingestion.background import IndexBuilder
from iris_rag.ingestion.chunking import chunk_text
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.settings import Settings
from iris_rag.stores.base import (
    CacheItem,
    CacheOwner,
    ChunkInput,
    DocumentInput,
    DocumentStore,
    NewCollection,
    cache_key,
    check_collection_id,
    check_embedding_model,
    document_source,
)
from iris_rag.stores.technique_index import ChunkEncoding, ChunkEncodingSource, SpanPooling, TechniqueIndex
from iris_rag.text import embedding_text, is_utf8, without_nul

MAX_ID_LENGTH = 256


def _setting_range(name: str) -> tuple[int, int]:
    """The least and greatest value Settings allows a field (its ge and le)."""
    metadata = Settings.model_fields[name].metadata
    bounds = {key: getattr(item, key) for item in metadata for key in ("ge", "le") if hasattr(item, key)}
    return cast(int, bounds["ge"]), cast(int, bounds["le"])


# A call's chunk_size and chunk_overlap keep to the limits of CHUNK_SIZE and CHUNK_OVERLAP, whoever calls.
CHUNKING_RANGES = {name: _setting_range(name) for name in ("chunk_size", "chunk_overlap")}


@dataclass
class IngestResult:
    """What one ingest call did (the rag_ingest output shape)."""

    collection_id: str
    document_ids: list[str] = field(default_factory=list)
    chunks_created: int = 0
    embeddings_reused: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    time_ms: float = 0.0
    indexes_building: list[str] = field(default_factory=list)  # techniques whose index is built afterwards
    left: list[str] = field(default_factory=list)  # ids `only_if` refused at the commit, left as stored

    def to_dict(self) -> dict[str, Any]:
        """The wire shape."""
        return {
            "collection_id": self.collection_id,
            "ingested_count": len(self.document_ids),
            "document_ids": self.document_ids,
            "chunks_created": self.chunks_created,
            "embeddings_reused": self.embeddings_reused,
            "errors": self.errors,
            "time_ms": round(self.time_ms, 3),
            **({"indexes_building": self.indexes_building} if self.indexes_building else {}),
        }


@dataclass
class IngestTotals:
    """Running totals over several ingest calls (the CLI and reindex ingest in batches)."""

    documents: int = 0
    chunks: int = 0
    embeddings_reused: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # documents left as they were (changed or deleted by another writer meanwhile)

    def add(self, result: IngestResult) -> None:
        """Count one call's result."""
        self.documents += len(result.document_ids)
        self.chunks += result.chunks_created
        self.embeddings_reused += result.embeddings_reused
        self.errors.extend(result.errors)
        self.skipped += len(result.left)

    def to_dict(self, collection_id: str) -> dict[str, Any]:
        """A summary."""
        return {
            "collection_id": collection_id,
            "documents": self.documents,
            "chunks": self.chunks,
            "embeddings_reused": self.embeddings_reused,
            "errors": self.errors,
            "skipped": self.skipped,
        }


class Ingestor:
    """Turns source documents into stored, searchable chunks."""

    def __init__(
        self,
        settings: Settings,
        store: DocumentStore,
        embedder: TextEncoder,
        technique_indexes: list[TechniqueIndex] | None = None,
        builder: IndexBuilder | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.technique_indexes = technique_indexes or []
        # INDEX_BUILD=background: the builder's indexes are built after the commit, not in the transaction.
        self.builder = builder

    @property
    def inline_indexes(self) -> list[TechniqueIndex]:
        """The technique indexes built inside the ingest's transaction (all, without a background builder)."""
        builder = self.builder
        return [i for i in self.technique_indexes if builder is None or not builder.builds(i)]

    def _shared_pass(
        self, indexes: list[TechniqueIndex]
    ) -> tuple[ChunkEncodingSource | None, SpanPooling | None]:
        """The index whose forward pass over the chunks also gives their vectors, and the one pooling it.

        rag_colbert's index runs the model over every chunk anyway; its pass gives the dense vectors too
        (when that index is built here, inside the ingest). NODERAG_LEAF_VECTORS=pooled: rag_noderag's
        sentence vectors come from the same pass, its hidden states pooled over each sentence (off by
        default: 0.008 lower on a SciFact test subset).
        """
        source = next((i for i in indexes if isinstance(i, ChunkEncodingSource)), None)
        pooling = self.settings.noderag_leaf_vectors == "pooled"
        spans = next((i for i in indexes if isinstance(i, SpanPooling)), None)
        return source, spans if pooling else None

    def ingest(
        self,
        collection_id: str,
        documents: Iterable[SourceDocument],
        *,
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
        only_if: Callable[[str], bool] | None = None,
        every_index: bool = False,
    ) -> IngestResult:
        """Ingest a batch in one store transaction; returns ids written and per-document errors.

        A new collection comes into being in that transaction too. The request's cancellation is checked
        between encode slices and stages and before the commit: a cancelled ingest stores nothing. With a
        background builder, its indexes are queued once the commit is done (result.indexes_building).

        `only_if`: asked of each document's id inside the commit's transaction, once it has waited for the
        collection's other writers (DocumentStore.collection_transaction); a document it refuses is left
        as stored (result.left). `every_index`: the background builder's indexes are built in the
        transaction too, so a replaced document's old rows answer until its new ones are in (a reindex).
        """
        ingest = Ingest(chunk_size, chunk_overlap, only_if, every_index)
        if self.builder is None:
            return self._ingest(collection_id, documents, ingest)
        with self.builder.core_ingest():  # the background builder waits for the core to be done
            return self._ingest(collection_id, documents, ingest)

    def chunking(self, chunk_size: int | None, chunk_overlap: int | None) -> tuple[int, int]:
        """The chunk size and overlap a call asks for (None: the settings'), refused out of their range."""
        size = self.settings.chunk_size if chunk_size is None else chunk_size
        overlap = self.settings.chunk_overlap if chunk_overlap is None else chunk_overlap
        for name, value in (("chunk_size", size), ("chunk_overlap", overlap)):
            low, high = CHUNKING_RANGES[name]
            if not low <= value <= high:
                msg = f"{name} {value} is out of range {low}-{high} (the limits of {name.upper()})"
                raise InvalidParametersError(msg, {name: value, "minimum": low, "maximum": high})
        if overlap >= size:
            msg = f"chunk_overlap ({overlap}) must be smaller than chunk_size ({size})"
            raise InvalidParametersError(msg)
        return size, overlap

    def screen(
        self, documents: Iterable[SourceDocument]
    ) -> tuple[list[tuple[str, SourceDocument]], list[dict[str, Any]]]:
        """The documents an ingest accepts, with their stored ids, and the errors of those it refuses.

        NUL characters are dropped first; an error's index is the document's place. One check for an
        ingest and for what `iris-rag sync --dry-run` says an ingest would do.
        """
        accepted: list[tuple[str, SourceDocument]] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()
        for position, read in enumerate(documents):
            document = replace(
                read,
                content=without_nul(read.content),
                title=without_nul(read.title),
                metadata=without_nul(read.metadata),
            )
            doc_id = stored_id(document)
            problem = self._problem(doc_id, document, seen)
            if problem is not None:
                code, message = problem
                errors.append({"index": position, "id": document.id, "code": code, "message": message})
                continue
            seen.add(doc_id)
            accepted.append((doc_id, document))
        return accepted, errors

    def _ingest(
        self, collection_id: str, documents: Iterable[SourceDocument], ingest: Ingest
    ) -> IngestResult:
        started = time.perf_counter()
        size, overlap = self.chunking(ingest.chunk_size, ingest.chunk_overlap)
        check_collection_id(collection_id)
        collection = self.store.get_collection(collection_id)
        new_collection = None
        if collection is not None:
            check_embedding_model(collection, self.settings.embedding_model_id)
        else:
            new_collection = NewCollection(self.settings.embedding_model_id, self.embedder.dimension)
        result = IngestResult(collection_id)
        screened, result.errors = self.screen(documents)
        accepted = [(i, d, chunk_text(d.content, size=size, overlap=overlap)) for i, d in screened]
        indexes = self.technique_indexes if ingest.every_index else self.inline_indexes
        encoding_source, span_pooling = self._shared_pass(indexes)

        check_cancelled()
        texts = [embedding_text(doc.title, span.text) for _, doc, spans in accepted for span in spans]
        owners = [
            CacheOwner(collection_id, doc_id, document_source(doc.title, doc.content))
            for doc_id, doc, spans in accepted
            for _ in spans
        ]
        shared = None
        if encoding_source and texts:
            progress.stage(f"encoding {len(texts)} chunks with token vectors")
            pooling = None
            if span_pooling is not None:
                pooling = [
                    chunk_spans
                    for _, doc, doc_chunks in accepted
                    for chunk_spans in span_pooling.pooling_spans(
                        doc.title, doc.content, [(c.start, c.end) for c in doc_chunks]
                    )
                ]
            shared = encoding_source.encode_chunks(texts, pooling)
        progress.stage(f"embedding {len(texts)} chunks of {len(accepted)} documents")
        # A key restricted to some collections reuses only its collection's vectors: a shared hit (and its
        # time saved) would tell it that a collection it cannot see holds the same text.
        private = not access.sees_everything()
        vectors, result.embeddings_reused = self._embed(texts, owners, shared, collection_id, private=private)

        inputs: list[DocumentInput] = []
        row = 0
        for doc_id, doc, spans in accepted:
            chunks = [
                ChunkInput(
                    i,
                    span.text,
                    span.start,
                    span.end,
                    vectors[row + i],
                    shared[row + i] if shared else None,
                )
                for i, span in enumerate(spans)
            ]
            row += len(spans)
            inputs.append(DocumentInput(doc_id, doc.title, doc.content, dict(doc.metadata), chunks))
        # Technique indexes do their heavy work here, outside the store's transaction.
        prepared: dict[str, Any] = {}
        for index in indexes:
            check_cancelled()
            progress.stage(f"building the {index.name} index")
            prepared[index.name] = index.prepare(collection_id, inputs)
        check_cancelled()
        progress.stage("committing")
        if ingest.only_if is None:
            if inputs:
                result.chunks_created = self.store.upsert_documents(
                    collection_id, inputs, prepared, new_collection=new_collection
                )
        elif inputs:
            with self.store.collection_transaction(collection_id):
                kept = {d.id for d in inputs if ingest.only_if(d.id)}
                result.left = [d.id for d in inputs if d.id not in kept]
                inputs = [d for d in inputs if d.id in kept]
                if inputs:  # an index's write takes the prepared rows of these documents only
                    result.chunks_created = self.store.upsert_documents(
                        collection_id, inputs, prepared, new_collection=new_collection
                    )
        result.document_ids = [d.id for d in inputs]
        if self.builder is not None and inputs and not ingest.every_index:
            self.builder.submit(collection_id, result.document_ids)
            result.indexes_building = sorted(self.builder.indexes)
        result.time_ms = (time.perf_counter() - started) * 1000
        return result

    def _embed(
        self,
        texts: list[str],
        owners: list[CacheOwner],
        shared: list[ChunkEncoding] | None = None,
        collection_id: str = "",
        *,
        private: bool = False,
    ) -> tuple[npt.NDArray[np.float32], int]:
        """Vectors for the texts, from the cache where the same model already embedded the same text.

        `owners`: each text's document, which owns the vector cached for it (the first, for a text repeated).
        `shared`: an index's forward pass over the same texts; its exact dense vectors are used as is.
        `private`: the cache entries are the collection's own, read and written under a key scoped to it;
        otherwise (a caller who sees every collection) entries are shared, and the collection's own ones
        are read too (a reindex after a restricted key's ingest embeds nothing again).
        """
        model = self.settings.embedding_model_id
        scoped = [cache_key(text, collection_id) for text in texts]
        hashes = scoped if private else [cache_key(text) for text in texts]
        wanted = set(hashes) if private else {*hashes, *scoped}
        cached = self.store.cached_embeddings(model, list(wanted))
        for key, own in zip(hashes, scoped, strict=True):
            if key not in cached and own in cached:
                cached[key] = cached[own]
        known = {} if shared is None else {h: e.dense for h, e in zip(hashes, shared, strict=True)}
        owner_of: dict[bytes, CacheOwner] = {}
        for h, owner in zip(hashes, owners, strict=True):
            owner_of.setdefault(h, owner)
        missing = list({h: text for h, text in zip(hashes, texts, strict=True) if h not in cached}.items())
        from_pass = [(h, v) for h, _ in missing if (v := known.get(h)) is not None]
        to_encode = [(h, text) for h, text in missing if known.get(h) is None]
        # Bulk work: sliced behind queries' encodes, with a cancellation check between slices.
        fresh = self.embedder.encode([text for _, text in to_encode], bulk=True)
        new = [*from_pass, *((h, fresh[i]) for i, (h, _) in enumerate(to_encode))]
        items: list[CacheItem] = [(h, v, owner_of[h]) for h, v in new]
        self.store.cache_embeddings(model, items)
        cached.update(new)
        dimension = self.embedder.dimension
        vectors = np.stack([cached[h] for h in hashes]) if hashes else np.zeros((0, dimension), np.float32)
        return vectors, len(texts) - len(missing)

    def _problem(self, doc_id: str, document: SourceDocument, seen: set[str]) -> tuple[str, str] | None:
        if not doc_id.strip() or len(doc_id) > MAX_ID_LENGTH:
            return (
                "INVALID_DOCUMENT",
                f"document id must be 1-{MAX_ID_LENGTH} characters, not only whitespace",
            )
        if "\x00" in doc_id:
            return "INVALID_DOCUMENT", "document id must not contain a NUL character"
        if doc_id in seen:
            return "DUPLICATE_DOCUMENT_ID", f"document id {doc_id!r} appears more than once in this call"
        for name, text in (("document id", doc_id), ("title", document.title), ("content", document.content)):
            if not is_utf8(text):  # a lone surrogate: a name or bytes that were not UTF-8, kept as they were
                return "INVALID_DOCUMENT", f"{name} is not valid Unicode text (a lone surrogate)"
        if not document.content.strip():
            return "INVALID_DOCUMENT", "content is empty or only whitespace"
        if len(document.content) > self.settings.max_document_chars:
            return (
                "INVALID_DOCUMENT",
                f"content has {len(document.content)} characters, over MAX_DOCUMENT_CHARS="
                f"{self.settings.max_document_chars}",
            )
        return None


@dataclass(frozen=True, slots=True)
class Ingest:
    """How one ingest call writes (Ingestor.ingest's options)."""

    chunk_size: int | None
    chunk_overlap: int | None
    only_if: Callable[[str], bool] | None
    every_index: bool


def stored_id(document: SourceDocument) -> str:
    """The id a document is stored under: its own, or one made from its content (NUL characters dropped)."""
    if document.id is not None:
        return document.id
    return _content_id(without_nul(document.content))


def _content_id(content: str) -> str:
    return "doc-" + hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:16]

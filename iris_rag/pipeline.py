"""The pipeline template: validate, retrieve, generate, measure, format. Techniques override retrieve()."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from iris_rag import access
from iris_rag.cancellation import check_cancelled
from iris_rag.encoder import TextEncoder
from iris_rag.errors import (
    GenerationFailedError,
    IndexNotBuiltError,
    InvalidParametersError,
    LlmServiceUnavailableError,
    RagError,
    RequestCancelledError,
    RetrievalFailedError,
)
from iris_rag.generation import NOTHING_RETRIEVED, RELEVANCE_FLOOR, Generation, Generator, Passage
from iris_rag.ranking import RankingOptions, check_ranking, pool_size, rerank
from iris_rag.settings import Settings
from iris_rag.stores.base import CollectionInfo, DocumentStore, StoredChunk, check_embedding_model
from iris_rag.stores.filters import MetadataFilter, parse_filters
from iris_rag.stores.technique_index import IndexProgress, TechniqueIndex
from iris_rag.validation import model_errors


class QueryOptions(BaseModel):
    """options{}: the same for every technique (schema: common.json#/$defs/options)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int = Field(5, ge=1, le=50)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(1024, ge=1, le=8192)
    include_sources: bool = True
    min_similarity: float = Field(0.0, ge=0, le=1)
    generate: bool = True
    filters: dict[str, Any] | None = None
    ranking: RankingOptions | None = None
    cot_steps: bool = False

    def check(self) -> None:
        """Refuse combinations the schema cannot express (INVALID_PARAMETERS)."""
        if self.ranking is not None:
            check_ranking(self.ranking)
        if self.cot_steps and not self.generate:
            msg = "options.cot_steps needs generate: true (the steps lead to an answer)"
            raise InvalidParametersError(msg)

    def for_retrieval(self) -> QueryOptions:
        """The options retrieve() gets: with ranking, a wider pool than top_k to rerank."""
        if self.ranking is None:
            return self
        return self.model_copy(update={"top_k": pool_size(self.top_k, self.ranking)})


class TechniqueRequest(BaseModel):
    """A technique tool's arguments, after schema validation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: str
    collection_id: str | None = None
    options: QueryOptions = QueryOptions()
    technique_params: dict[str, Any] = Field(default_factory=dict)


class NoParams(BaseModel):
    """For techniques without technique_params."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(slots=True)
class RetrievedDocument:
    """One retrieved chunk, as every technique returns it."""

    chunk: StoredChunk
    score: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, collection_id: str, rank: int) -> dict[str, Any]:
        """The wire shape (common.json#/$defs/retrieved_document)."""
        chunk = self.chunk
        metadata = {
            **chunk.metadata,
            "chunk_index": chunk.index,
            "start_char": chunk.start_char,
            "end_char": chunk.end_char,
        }
        source = chunk.metadata.get("source")
        return {
            "id": chunk.document_id,
            "chunk_id": chunk.chunk_id,
            "title": chunk.title,
            "content": chunk.content,
            "metadata": metadata,
            "similarity_score": round(self.score, 6),
            "source": source if isinstance(source, str) else f"{collection_id}/{chunk.document_id}",
            "rank": rank,
            **({"score_details": self.details} if self.details else {}),
        }


@dataclass(slots=True)
class Retrieval:
    """What retrieve() found, and what the technique wants to report about how."""

    documents: list[RetrievedDocument]
    documents_searched: int
    technique_specific: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PipelineContext:
    """The shared parts every pipeline uses, built once per worker."""

    settings: Settings
    store: DocumentStore
    embedder: TextEncoder
    generator: Generator
    # INDEX_BUILD=background: the builder of the technique indexes (None when they are built inline).
    index_builder: IndexProgress | None = None


class Pipeline(ABC):
    """A RAG technique. Subclasses set `technique` and `params_model` and implement retrieve()."""

    technique: ClassVar[str]
    params_model: ClassVar[type[BaseModel]] = NoParams
    # Needs the local model's word pieces and hidden states (not an embedding API): refused at start without.
    needs_token_level: ClassVar[bool] = False

    def __init__(self, context: PipelineContext) -> None:
        self.context = context

    def technique_index(self) -> TechniqueIndex | None:
        """The index this technique builds at ingest, if any: the same object on every call."""
        return None

    def extra_methods(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """Bridge methods this technique adds besides execute (each backs a tool in schemas/tools/)."""
        return {}

    def require_index(self, collection: CollectionInfo) -> None:
        """Refuse to search a collection that this technique's index does not fully cover.

        Unless the background builder is still building it: then the search covers the documents indexed so
        far, and the result says so (index_note).
        """
        index = self.technique_index()
        if index is None:
            return
        indexed = index.indexed_documents(collection.id)
        builder = self.context.index_builder
        if indexed < collection.document_count and builder is not None and builder.pending(collection.id):
            return  # still being built: the search covers what is indexed, and says so (index_note)
        if indexed < collection.document_count:
            # The builder knows only its own process's builds: another one (`iris-rag ingest` still building
            # after its commit, a server) may be building this index now, and the store does not say so.
            msg = (
                f"collection {collection.id!r} has {collection.document_count} documents but the "
                f"{self.technique} index covers {indexed} and no build of it runs in this process (documents "
                "ingested while this technique was not served, or a build that failed: rag_health_check "
                "says); if another process (`iris-rag ingest`, a server) is building it, wait for it, else "
                f"run `iris-rag reindex --collection {collection.id}` (no re-embedding: vectors are cached)"
            )
            raise IndexNotBuiltError(msg, {"indexed": indexed, "documents": collection.document_count})

    def index_note(self, collection: CollectionInfo) -> dict[str, Any]:
        """While the background builder is building this technique's index: how much it covers, to report."""
        index = self.technique_index()
        builder = self.context.index_builder
        if index is None or builder is None or not builder.pending(collection.id):
            return {}
        indexed = index.indexed_documents(collection.id)
        missing = collection.document_count - indexed
        if missing <= 0:
            return {}
        return {
            "index_build": {
                "state": "building",
                "indexed_documents": indexed,
                "documents": collection.document_count,
                "missing_documents": missing,
                "note": (
                    f"the {self.technique} index is still being built: this search covered {indexed} of "
                    f"{collection.document_count} documents; {missing} are not searched yet "
                    "(rag_health_check shows the progress)"
                ),
            }
        }

    @abstractmethod
    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: Any
    ) -> Retrieval:
        """Find the chunks for the query, best first (at most options.top_k)."""

    def query_similarities(
        self, query: str, collection: CollectionInfo, documents: list[RetrievedDocument]
    ) -> dict[str, float]:
        """Cosine similarity of the query and each retrieved chunk that has a stored vector."""
        vector = self.context.embedder.encode_query(query)  # usually remembered from retrieve()
        chunk_ids = [d.chunk.chunk_id for d in documents]
        return self.context.store.vector_scores(collection.id, vector, chunk_ids)

    def generate(
        self,
        query: str,
        documents: list[RetrievedDocument],
        options: QueryOptions,
        similarity: dict[str, float] | None = None,
        empty_reason: str = NOTHING_RETRIEVED,
    ) -> Generation:
        """Write the answer from the retrieved chunks; citations are numbered by document."""
        similarity = similarity or {}
        citations: dict[str, int] = {}
        passages = [
            Passage(
                citation=citations.setdefault(doc.chunk.document_id, len(citations) + 1),
                document_id=doc.chunk.document_id,
                title=doc.chunk.title,
                content=doc.chunk.content,
                score=doc.score,
                query_similarity=similarity.get(doc.chunk.chunk_id),
                chunk_id=doc.chunk.chunk_id,
            )
            for doc in documents
        ]
        return self.context.generator.generate(
            query,
            passages,
            temperature=options.temperature,
            max_tokens=options.max_tokens,
            steps=options.cot_steps,
            empty_reason=empty_reason,
        )

    # The template
    def run(self, request: TechniqueRequest) -> dict[str, Any]:
        """Validate, retrieve, generate, measure and format one request."""
        started = time.perf_counter()
        params = self._parse_params(request.technique_params)
        collection = self.resolve_collection(request.collection_id)
        options = request.options
        metadata_filter = parse_filters(options.filters)
        options.check()

        check_cancelled()
        note = self.index_note(collection)  # read before the search: it covers at least this much
        try:
            retrieval = self.retrieve(request.query, collection, options.for_retrieval(), params)
        except RagError:
            raise
        except Exception as exc:
            msg = f"{self.technique} retrieval failed: {type(exc).__name__}: {exc}"
            raise RetrievalFailedError(msg) from exc
        retrieval.technique_specific.update(note)
        # Every technique scores on its own scale (cosine, fused min-max, RRF near 0.02, MaxSim): relevance
        # is judged on one scale, the query's cosine similarity to each chunk, whatever the technique.
        extractive = options.generate and self.context.generator.model_name == "extractive"
        similarity: dict[str, float] = {}
        if retrieval.documents and (options.min_similarity > 0 or extractive):
            similarity = self.query_similarities(request.query, collection, retrieval.documents)
        # min_similarity 0 (the default) filters nothing; a chunk with no stored vector (rag_sqlrag's rows)
        # is never dropped by it.
        threshold = options.min_similarity
        documents = [
            d
            for d in retrieval.documents
            if threshold == 0 or similarity.get(d.chunk.chunk_id, threshold) >= threshold
        ]
        if options.ranking is not None:
            documents = rerank(documents, options.ranking)
        documents = documents[: options.top_k]
        retrieved_at = time.perf_counter()

        filter_report = (
            self._filter_report(collection.id, metadata_filter, options)
            if metadata_filter is not None
            else None
        )
        generation: Generation | None = None
        error: RagError | None = None
        if options.generate:
            check_cancelled()  # between retrieval and the (possibly slow) generation
            # Said in the answer when no passage is left: the filters, min_similarity, or nothing found.
            empty_reason = _empty_reason(retrieval.documents, threshold, filter_report)
            try:
                generation = self.generate(request.query, documents, options, similarity, empty_reason)
            except RequestCancelledError:
                raise
            except RagError as exc:
                error = exc
            except Exception as exc:
                error = GenerationFailedError(f"{type(exc).__name__}: {exc}")
        finished = time.perf_counter()

        response: dict[str, Any] = {
            "success": error is None,
            "technique": self.technique,
            "query": request.query,
            "answer": generation.answer if generation else None,
            **({"cot_steps": generation.steps.to_dict()} if generation and generation.steps else {}),
            "retrieved_documents": [
                doc.to_dict(collection.id, rank) for rank, doc in enumerate(documents, start=1)
            ]
            if options.include_sources
            else [],
            "performance": {
                "total_time_ms": _ms(finished - started),
                "retrieval_time_ms": _ms(retrieved_at - started),
                "generation_time_ms": _ms(finished - retrieved_at),
                "documents_searched": retrieval.documents_searched,
            },
            "metadata": {
                "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "collection_id": collection.id,
                "model_info": {
                    "embedding_model": collection.embedding_model,
                    "llm_model": generation.model if generation else self.context.generator.model_name,
                },
                "answer_source": generation.source if generation else "none",
                **({"generation": generation.report} if generation and generation.report else {}),
                **(
                    {"relevance": {"best_query_similarity": round(best, 6), "floor": RELEVANCE_FLOOR}}
                    if (best := max(similarity.values(), default=None)) is not None
                    else {}
                ),
                "technique_specific": retrieval.technique_specific,
            },
        }
        if not options.include_sources:  # so a reader can tell "left out" from "nothing retrieved"
            response["metadata"]["sources_omitted"] = len(documents)
        if filter_report is not None:
            response["metadata"]["filters"] = filter_report
        if error is not None:
            response["error"] = error.to_dict()
            # LLM_SERVICE_UNAVAILABLE keeps its code; any other failure to answer is GENERATION_FAILED.
            unreachable = isinstance(error, LlmServiceUnavailableError)
            failure = LlmServiceUnavailableError if unreachable else GenerationFailedError
            raise failure(error.message, {"partial_result": response})
        return response

    def _filter_report(
        self, collection_id: str, metadata_filter: MetadataFilter, options: QueryOptions
    ) -> dict[str, Any]:
        """What the filter did: how many documents passed it, and which fields no document has."""
        store = self.context.store
        unknown = store.unknown_fields(collection_id, metadata_filter.fields)
        report: dict[str, Any] = {
            "applied": options.filters,
            "matched_documents": len(store.matching_document_ids(collection_id, metadata_filter)),
            "unknown_fields": unknown,
        }
        if unknown:
            report["note"] = f"no document has {', '.join(unknown)} in its metadata, so nothing matches"
        return report

    def _parse_params(self, raw: dict[str, Any]) -> Any:
        try:
            return self.params_model.model_validate(raw)
        except ValidationError as exc:
            errors = model_errors(exc)
            msg = f"invalid technique_params for {self.technique}: {'; '.join(errors)}"
            raise InvalidParametersError(msg, {"errors": errors}) from exc

    def resolve_collection(self, collection_id: str | None) -> CollectionInfo:
        """The collection to search; it must exist and match the loaded embedding model."""
        name = collection_id or self.context.settings.default_collection
        collection = self.context.store.get_collection(name) if access.can_see(name) else None
        if collection is None:
            known = [c.id for c in self.context.store.list_collections()]
            raise access.collection_not_found(name, known, "; ingest first")
        check_embedding_model(collection, self.context.settings.embedding_model_id)
        return collection


def _empty_reason(
    retrieved: list[RetrievedDocument], threshold: float, filter_report: dict[str, Any] | None
) -> str:
    """Why no passage is left to answer from, in the words the answer says it."""
    if filter_report is not None and not filter_report["matched_documents"]:
        unknown = filter_report["unknown_fields"]
        return (
            f"no document has {', '.join(unknown)} in its metadata"
            if unknown
            else "no document matches options.filters"
        )
    if retrieved:
        return f"no retrieved passage reached min_similarity {threshold:g}"
    return NOTHING_RETRIEVED


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)

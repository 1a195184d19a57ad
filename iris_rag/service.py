"""The composition root: builds the store, models, pipelines and monitor once, and serves every method."""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from iris_rag import __version__, access
from iris_rag.backends import create_store
from iris_rag.cancellation import check_cancelled
from iris_rag.encoder import TextEncoder, create_encoder, token_level
from iris_rag.errors import (
    CollectionNotFoundError,
    DocumentNotFoundError,
    InvalidParametersError,
    PipelineNotFoundError,
)
from iris_rag.generation import create_generator
from iris_rag.ingestion.background import IndexBuilder, document_fingerprint, fingerprinted_document
from iris_rag.ingestion.ingestor import Ingestor, IngestTotals
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.ingestion.paths import read_paths
from iris_rag.ingestion.roots import IngestRoots
from iris_rag.llm import TechniqueLLM
from iris_rag.llm_health import LlmProbe
from iris_rag.monitor import Monitor, correlation_of
from iris_rag.pipeline import Pipeline, PipelineContext, TechniqueRequest
from iris_rag.podcast.maker import PodcastMaker, PodcastRequest, podcast_file
from iris_rag.questions import SmartQuestions, SmartQuestionsRequest
from iris_rag.result_cache import ResultCache, cache_key
from iris_rag.schemas import CORRELATION_FIELDS, served_tool_specs, technique_tools, tool_specs
from iris_rag.settings import Settings, SettingsError
from iris_rag.stores.base import CollectionInfo
from iris_rag.stores.filters import parse_filters
from iris_rag.stores.technique_index import DocumentCoverage
from iris_rag.techniques.registry import PIPELINES
from iris_rag.text import without_nul
from iris_rag.validation import validate_arguments

logger = logging.getLogger(__name__)

# The SQLite store's disk reads degraded below this much free space, or 5% of a disk smaller than 20 GiB.
DISK_FREE_FLOOR = 1 << 30
DISK_FREE_SHARE = 0.05


def _cacheable(technique: str, request: TechniqueRequest) -> bool:
    """Whether a result depends only on the collection's documents (what its data version tracks).

    rag_sqlrag reads structured tables, which move no collection's version; a web search reads the world.
    """
    return technique != "sqlrag" and not request.technique_params.get("enable_web_search", False)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _served(settings: Settings, tools: dict[str, str]) -> set[str]:
    """The techniques to serve: RAG_TECHNIQUES, or every one with a pipeline and a tool schema."""
    available = {name for name in PIPELINES if name in tools}
    wanted = settings.served_techniques
    if wanted is None:
        return available
    unknown = sorted(set(wanted) - available)
    if unknown:
        msg = f"RAG_TECHNIQUES names unknown techniques {unknown}; available: {', '.join(sorted(available))}"
        raise SettingsError(msg)
    return set(wanted)


class RagService:
    """Everything the worker (and the CLI, and the benchmarks) call, one method per bridge method."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: TextEncoder | None = None,
        index_scan: Sequence[str] | None = None,
    ) -> None:
        """Build everything; `index_scan`: the collections whose missing index rows are built at start.

        None: every one (the worker). A CLI command names the one it writes, or none: a short process
        would abandon at exit the builds it started.
        """
        self.settings = settings
        self.started_at = time.time()
        self.store = create_store(settings)
        self.embedder = create_encoder(settings) if embedder is None else embedder
        self.generator = create_generator(settings)
        self.monitor = Monitor(self.store)
        self.result_cache = ResultCache(settings.cache_ttl_s) if settings.cache_enabled else None
        # INDEX_BUILD=background: one builder adds the technique indexes after each ingest's commit.
        self.index_builder = IndexBuilder(self.store) if settings.index_build == "background" else None
        context = PipelineContext(
            settings, self.store, self.embedder, self.generator, index_builder=self.index_builder
        )
        # Only techniques that have both a pipeline and a tool schema are served: no placeholder tools.
        self._tool_by_technique = technique_tools()
        self._tool_by_method = {
            spec["bridge"]["method"]: spec["name"]
            for spec in tool_specs()
            if "technique" not in spec["bridge"]
        }
        served = _served(settings, self._tool_by_technique)
        # A technique whose rows this backend cannot store yet (its storage contract has no implementation
        # here) is refused at start, by name, rather than at its first call.
        self.pipelines: dict[str, Pipeline] = {}
        unavailable = []
        for name, cls in PIPELINES.items():
            if name not in served:
                continue
            if cls.needs_token_level and not token_level(self.embedder):
                self.store.close()
                msg = (
                    f"rag_{name} needs the local embedding model's word pieces, which EMBEDDING_PROVIDER="
                    f"{settings.embedding_provider} does not give; leave it out of RAG_TECHNIQUES, e.g. "
                    "RAG_TECHNIQUES=basic,hyde,hybrid_ifind,crag,graphrag,noderag,sqlrag"
                )
                raise SettingsError(msg)
            try:
                self.pipelines[name] = cls(context)
            except NotImplementedError:
                unavailable.append(name)
        if unavailable:
            self.store.close()
            msg = (
                f"techniques {', '.join(sorted(unavailable))} are not yet available on the "
                f"{self.store.backend_name} store; serve the others, e.g. "
                "RAG_TECHNIQUES=basic,hyde,hybrid_ifind,crag"
            )
            raise SettingsError(msg)
        indexes = [i for p in self.pipelines.values() if (i := p.technique_index()) is not None]
        for index in indexes:
            self.store.register_index(index)
        if self.index_builder is not None:
            for name, pipeline in sorted(self.pipelines.items()):
                if (technique_index := pipeline.technique_index()) is not None:
                    self.index_builder.add(name, technique_index)
            self.index_builder.start(
                index_scan
            )  # first, documents an index lacks (a restart finishes a build)
        self.ingestor = Ingestor(settings, self.store, self.embedder, indexes, self.index_builder)

    def close(self) -> None:
        """Stop the index builder, store the last call records, then release the store."""
        if self.index_builder is not None:
            self.index_builder.close()
        self.monitor.flush()
        self.store.close()

    def wait_for_indexes(self, collection_id: str | None = None, *, quiet: bool = False) -> None:
        """Block until the background builder has built every queued index (the CLI's ingest and eval).

        Says so on stderr, with the documents left about every ten seconds, unless `quiet`.
        """
        builder = self.index_builder
        if builder is None:
            return
        last = 0.0

        def report(left: int) -> None:
            nonlocal last
            if not quiet and time.monotonic() - last >= 10:
                last = time.monotonic()
                names = ", ".join(sorted(builder.indexes))
                print(f"waiting for the technique indexes ({names}): {left} documents left", file=sys.stderr)

        builder.wait(collection_id, on_progress=report)
        if last and not quiet:
            print("the technique indexes are built", file=sys.stderr)
        failed = {k: v for k, v in builder.failures().items() if collection_id in (None, k[0])}
        for (collection, technique), error in sorted(failed.items()):
            print(f"the {technique} index of {collection} failed: {error}", file=sys.stderr)

    def describe(self, _params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The server's tools and their schemas (what the MCP front end lists)."""
        tools = served_tool_specs(self.pipelines)
        return {"server": {"name": "iris-rag", "version": __version__}, "tools": tools}

    def tool_for(self, method: str, params: dict[str, Any]) -> tuple[str, str | None]:
        """Which tool and technique a bridge call stands for (for the monitor)."""
        if method == "execute":
            technique = params.get("technique")
            name = technique if isinstance(technique, str) else None
            return self._tool_by_technique.get(name or "", f"rag_{name}"), name
        return self._tool_by_method.get(method, f"rag_{method}"), None

    def methods(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        """Every bridge method that backs a tool, the techniques' own included."""
        methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "execute": self.execute,
            "ingest": self.ingest,
            "list_collections": self.list_collections,
            "get_document": self.get_document,
            "list_documents": self.list_documents,
            "delete_documents": self.delete_documents,
            "delete_collection": self.delete_collection,
            "update_collection": self.update_collection,
            "health_check": self.health_check,
            "metrics": self.metrics,
            "smart_questions": self.smart_questions,
            "generate_podcast": self.generate_podcast,
        }
        for pipeline in self.pipelines.values():
            methods.update(pipeline.extra_methods())
        return methods

    def reindex(self, collection_id: str, *, batch_size: int = 256) -> dict[str, Any]:
        """Re-ingest a collection's stored documents, rebuilding chunks, keyword rows and technique indexes.

        The embedding cache holds every chunk's vector already, so nothing is embedded again. A document is
        rewritten only if it is still as it was read (its fingerprint, checked in the write's transaction):
        one another writer updated or deleted meanwhile is left as that writer left it (`skipped`). Every
        technique index, the background builder's too, is rebuilt in that transaction: a document's old
        rows answer until its new ones are in, and a reindex stopped midway leaves every index whole.
        """
        collection = self.store.get_collection(collection_id)
        if collection is None:
            msg = f"collection {collection_id!r} does not exist"
            raise CollectionNotFoundError(msg)
        document_ids = self.store.document_ids(collection_id)
        total = IngestTotals()
        for start in range(0, len(document_ids), batch_size):
            read = [
                fingerprinted_document(self.store, collection_id, d)
                for d in document_ids[start : start + batch_size]
            ]
            fingerprints = {d.id: fingerprint for d, fingerprint in filter(None, read)}
            sources = [SourceDocument(d.id, d.content, d.title, d.metadata) for d, _ in filter(None, read)]

            def unchanged(document_id: str, fingerprints: dict[str, bytes] = fingerprints) -> bool:
                now = document_fingerprint(self.store, collection_id, document_id)
                return now == fingerprints[document_id]

            result = self.ingestor.ingest(collection_id, sources, only_if=unchanged, every_index=True)
            total.add(result)
            total.skipped += len(read) - len(sources)  # deleted before it was read
            if total.skipped and self.store.get_collection(collection_id) is None:
                msg = f"collection {collection_id!r} does not exist (deleted while it was reindexed)"
                raise CollectionNotFoundError(msg)
        return total.to_dict(collection_id)

    def stale_indexes(self, collection_id: str) -> list[str]:
        """The techniques whose index does not cover every document of the collection."""
        collection = self.store.get_collection(collection_id)
        if collection is None:
            return []
        stale = []
        for name, pipeline in self.pipelines.items():
            index = pipeline.technique_index()
            if index and index.indexed_documents(collection_id) < collection.document_count:
                stale.append(name)
        return stale

    def execute(self, params: dict[str, Any]) -> dict[str, Any]:
        """Run a technique: params are {technique, arguments}."""
        technique = params.get("technique")
        pipeline = self.pipelines.get(technique) if isinstance(technique, str) else None
        if pipeline is None:
            msg = f"no technique {technique!r}; available: {', '.join(sorted(self.pipelines))}"
            raise PipelineNotFoundError(msg, {"available": sorted(self.pipelines)})
        arguments = validate_arguments(
            self._tool_by_technique[pipeline.technique], params.get("arguments", {})
        )
        # LLM_TEMPERATURE and LLM_MAX_TOKENS are the defaults of the options a call leaves out.
        options = {
            "temperature": self.settings.llm_temperature,
            "max_tokens": self.settings.llm_max_tokens,
            **arguments.get("options", {}),
        }
        request = TechniqueRequest.model_validate({**_without_correlation(arguments), "options": options})
        if self.result_cache is None or not _cacheable(pipeline.technique, request):
            return pipeline.run(request)
        collection_id = request.collection_id or self.settings.default_collection
        key = cache_key(
            pipeline.technique,
            request.model_dump(mode="json", exclude={"collection_id"}) | {"collection": collection_id},
            self.store.data_version(collection_id),
        )
        cached = self.result_cache.get(key) if access.can_see(collection_id) else None
        if cached is not None:
            result, age_s = cached
            result["metadata"]["cache"] = {"hit": True, "age_s": round(age_s, 3)}
            return result
        result = pipeline.run(request)
        if "index_build" not in result["metadata"]["technique_specific"]:  # a partial index: not kept
            self.result_cache.put(key, result)
        result["metadata"]["cache"] = {"hit": False}
        return result

    def ingest(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_ingest: add or replace documents, given as text or as files to read under RAG_INGEST_ROOTS."""
        arguments = validate_arguments("rag_ingest", params)
        # Exactly one of the two; not a top-level oneOf, which some LLM tool APIs refuse to accept.
        if ("documents" in arguments) == ("paths" in arguments):
            msg = "give either documents or paths (exactly one of the two)"
            raise InvalidParametersError(msg)
        collection_id: str = arguments["collection_id"]
        access.require_writable(collection_id)
        if "paths" in arguments:
            return self._ingest_paths(collection_id, arguments["paths"])
        documents = [
            SourceDocument(
                id=item.get("id"),
                content=item["content"],
                title=item.get("title", ""),
                metadata=item.get("metadata", {}),
            )
            for item in arguments["documents"]
        ]
        return self.ingestor.ingest(collection_id, documents).to_dict()

    def _ingest_paths(self, collection_id: str, paths: list[str]) -> dict[str, Any]:
        """Read the files in the worker, then ingest them as one call (one transaction) of documents."""
        roots = IngestRoots.parse(self.settings.ingest_roots)
        read = read_paths(paths, roots, max_bytes=self.settings.ingest_max_bytes)
        result = self.ingestor.ingest(collection_id, read.documents)
        # The ingestor numbers documents; the caller numbered paths, and knows files by their paths.
        for error in result.errors:
            document = read.documents[error["index"]]
            error["index"] = read.origins[error["index"]]
            error["message"] = f"{document.metadata['source_path']}: {error['message']}"
        result.errors[:0] = read.errors
        return result.to_dict()

    def list_collections(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_list_collections."""
        validate_arguments("rag_list_collections", params)
        return {
            "default_collection": self.settings.default_collection,
            "collections": [
                {
                    "id": c.id,
                    "document_count": c.document_count,
                    "chunk_count": c.chunk_count,
                    "embedding_model": c.embedding_model,
                    "dimension": c.dimension,
                    "created_at": c.created_at,
                    "updated_at": c.updated_at,
                    "description": c.description,
                }
                for c in self.store.list_collections()
                if access.can_see(c.id)
            ],
        }

    def get_document(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_get_document."""
        arguments = validate_arguments("rag_get_document", params)
        collection_id = arguments.get("collection_id") or self.settings.default_collection
        document = (
            self.store.get_document(collection_id, arguments["document_id"])
            if access.can_see(collection_id)
            else None
        )
        if document is None:
            self._visible_collection(collection_id)  # a missing collection is told as such, not as a document
            msg = f"no document {arguments['document_id']!r} in collection {collection_id!r}"
            raise DocumentNotFoundError(msg, {"collection_id": collection_id})
        result: dict[str, Any] = {
            "id": document.id,
            "collection_id": document.collection_id,
            "title": document.title,
            "content": document.content,
            "metadata": document.metadata,
            "created_at": document.created_at,
            "updated_at": document.updated_at,
        }
        if arguments.get("include_chunks"):
            result["chunks"] = [
                {
                    "chunk_id": c.chunk_id,
                    "index": c.index,
                    "content": c.content,
                    "start_char": c.start_char,
                    "end_char": c.end_char,
                }
                for c in self.store.get_document_chunks(collection_id, document.id)
            ]
        return result

    def _visible_collection(self, collection_id: str) -> CollectionInfo:
        """The collection, if it exists and the caller may see it; else the one not-found answer."""
        collection = self.store.get_collection(collection_id) if access.can_see(collection_id) else None
        if collection is None:
            raise access.collection_not_found(collection_id, [c.id for c in self.store.list_collections()])
        return collection

    def list_documents(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_list_documents: a page of a collection's documents, oldest first."""
        arguments = validate_arguments("rag_list_documents", params)
        collection = self._visible_collection(
            arguments.get("collection_id") or self.settings.default_collection
        )
        limit = int(arguments.get("limit", 50))
        offset = int(arguments.get("cursor", "0"))
        page = self.store.list_documents(collection.id, offset, limit)
        more = offset + len(page) < collection.document_count
        return {
            "collection_id": collection.id,
            "document_count": collection.document_count,
            "documents": [
                {
                    "id": d.id,
                    "title": d.title,
                    "chars": d.chars,
                    "chunks": d.chunks,
                    "created_at": d.created_at,
                    "updated_at": d.updated_at,
                }
                for d in page
            ],
            "next_cursor": str(offset + len(page)) if more and page else None,
        }

    def delete_documents(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_delete_documents: by ids or by metadata filter, all in one transaction."""
        arguments = validate_arguments("rag_delete_documents", params)
        collection_id: str = arguments["collection_id"]
        access.require_writable(collection_id)
        if ("document_ids" in arguments) == ("filter" in arguments):
            msg = "give either document_ids or filter (exactly one of the two)"
            raise InvalidParametersError(msg)
        collection = self._visible_collection(collection_id)
        if "document_ids" in arguments:
            wanted: list[str] = list(arguments["document_ids"])
        else:
            metadata_filter = parse_filters(arguments["filter"])
            if metadata_filter is None:  # {} would match every document: deleting all needs ids
                msg = "filter must name at least one condition"
                raise InvalidParametersError(msg)
            matching = self.store.matching_document_ids(collection.id, metadata_filter)
            wanted = [d for d in self.store.document_ids(collection.id) if d in matching]
        deleted: list[str] = []
        missing: list[str] = []
        with self.store.transaction():
            for document_id in wanted:
                check_cancelled()
                (deleted if self.store.delete_document(collection.id, document_id) else missing).append(
                    document_id
                )
        return {
            "collection_id": collection.id,
            "deleted_count": len(deleted),
            "deleted_ids": deleted,
            "not_found_ids": missing,
        }

    def delete_collection(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_delete_collection: the collection named twice, then everything of it in one transaction."""
        arguments = validate_arguments("rag_delete_collection", params)
        collection_id: str = arguments["collection_id"]
        if arguments["confirm_collection_id"] != collection_id:
            msg = "confirm_collection_id must repeat collection_id exactly; nothing was deleted"
            raise InvalidParametersError(msg)
        access.require_writable(collection_id)
        self._visible_collection(collection_id)
        if self.index_builder is not None:
            self.index_builder.cancel_collection(collection_id)
        deleted = self.store.delete_collection(collection_id)
        if deleted is None:  # deleted meanwhile by another call or process
            raise access.collection_not_found(collection_id, [c.id for c in self.store.list_collections()])
        return {"collection_id": collection_id, "deleted": True, "documents_deleted": deleted}

    def update_collection(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_update_collection: set the collection's description."""
        arguments = validate_arguments("rag_update_collection", params)
        collection_id: str = arguments["collection_id"]
        access.require_writable(collection_id)
        self._visible_collection(collection_id)
        # A NUL is dropped, as at ingest: PostgreSQL's text cannot hold one.
        updated = self.store.set_description(collection_id, without_nul(arguments["description"]))
        if updated is None:  # deleted meanwhile by another call or process
            raise access.collection_not_found(collection_id, [c.id for c in self.store.list_collections()])
        return {
            "collection_id": updated.id,
            "description": updated.description,
            "updated_at": updated.updated_at,
        }

    @cached_property
    def _technique_llm(self) -> TechniqueLLM:
        return TechniqueLLM(self.settings)

    def smart_questions(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_smart_questions: follow-up questions, each checked to retrieve its source chunk."""
        arguments = validate_arguments("rag_smart_questions", params)
        request = SmartQuestionsRequest.model_validate(_without_correlation(arguments))
        return SmartQuestions(self.pipelines, self._technique_llm).run(request)

    def generate_podcast(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_generate_podcast: a two-voice podcast, spoken offline and saved under RAG_DATA_DIR."""
        arguments = validate_arguments("rag_generate_podcast", params)
        request = PodcastRequest.model_validate(_without_correlation(arguments))
        return PodcastMaker(self.pipelines, self._technique_llm, self.settings.data_dir).run(request)

    def podcast_file(self, params: dict[str, Any]) -> dict[str, Any]:
        """The audio file behind a rag://podcast/{name} resource (the front end reads it)."""
        name = params.get("name")
        return podcast_file(self.settings.data_dir, name if isinstance(name, str) else "")

    def metrics(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_metrics."""
        arguments = validate_arguments("rag_metrics", params)
        return self.monitor.metrics(
            arguments.get("time_range", "1h"), _technique_names(arguments.get("technique_filter"))
        )

    def record_call(self, params: dict[str, Any]) -> dict[str, Any]:
        """Record a call the front end answered itself (a rejected argument list, say)."""
        self.monitor.record(
            str(params.get("tool", "unknown")),
            params.get("technique") if isinstance(params.get("technique"), str) else None,
            float(params.get("duration_ms", 0.0)),
            bool(params.get("success", False)),
            params.get("error_code") if isinstance(params.get("error_code"), str) else None,
            **correlation_of(params),
        )
        return {"recorded": True}

    def health_check(self, params: dict[str, Any]) -> dict[str, Any]:
        """rag_health_check: each component checked now, worst status wins."""
        arguments = validate_arguments("rag_health_check", params)
        details = bool(arguments.get("include_details", False))
        # The seed names the store's component iris_database when IRIS is the store.
        database = "iris_database" if self.store.backend_name == "iris" else "database"
        reached = _check(self._check_database, details)
        # An unreachable database is not asked again for the store's sizes and the call log: each would
        # wait as long as the first check did (the pool's wait, 5 s on PostgreSQL).
        down = reached["status"] == "unhealthy"
        components = {
            database: reached,
            "python_bridge": _check(self._check_worker, details),
            "embedding_service": _check(self._check_embedder, details),
            "llm_service": _check(self._check_llm, details),
            "vector_store": _check(self._database_down if down else self._check_vector_store, details),
        }
        statuses = {c["status"] for c in components.values()}
        overall = (
            "unhealthy" if "unhealthy" in statuses else "degraded" if "degraded" in statuses else "healthy"
        )
        performance = {} if down else self._performance()
        return {"status": overall, "timestamp": _now(), "components": components, **performance}

    @staticmethod
    def _database_down() -> tuple[str, str | None, dict[str, Any]]:
        return "unhealthy", "the database cannot be reached (see its component)", {}

    def _performance(self) -> dict[str, Any]:
        """The spec's performance block: the last hour's calls; left out if the call log cannot be read."""
        try:
            # The store's sums: health (GET /health, once a second) reads no call record.
            return {"performance": self.monitor.performance("1h")}
        except Exception:  # the database component reports why; health must still answer
            logger.warning("health_check: no performance figures", exc_info=True)
            return {}

    def _check_database(self) -> tuple[str, str | None, dict[str, Any]]:
        self.store.ping()
        details: dict[str, Any] = {"backend": self.store.backend_name}
        # A PostgreSQL or IRIS server's disk is on its own host, out of this process's sight.
        if self.store.backend_name != "sqlite":
            return "healthy", None, details
        return self._check_disk(details)

    def _check_disk(self, details: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
        """SQLite's disk: degraded under DISK_FREE_FLOOR free (5% of a smaller disk), before writes fail.

        A full disk fails every write (ingests, call records) while reads and the ping still answer.
        """
        usage = shutil.disk_usage(self.settings.data_dir)
        floor = min(DISK_FREE_FLOOR, int(usage.total * DISK_FREE_SHARE))
        # Where the server keeps its files is the operator's (as in the vector store's details).
        operator = access.sees_everything()
        if operator:
            details |= {"data_dir": str(self.settings.data_dir), "disk_free_bytes": usage.free}
        if usage.free >= floor:
            return "healthy", None, details
        where = f"RAG_DATA_DIR ({self.settings.data_dir})" if operator else "RAG_DATA_DIR"
        reason = (
            f"{usage.free >> 20} MiB free on the disk of {where}, under {floor >> 20} MiB: the store "
            "cannot write (ingests, call records) once it is full; free space there or move RAG_DATA_DIR"
        )
        return "degraded", reason, details

    def _check_worker(self) -> tuple[str, str | None, dict[str, Any]]:
        return (
            "healthy",
            None,
            {
                "uptime_s": round(time.time() - self.started_at, 1),
                "version": __version__,
                "techniques": sorted(self.pipelines),
                "result_cache": None if self.result_cache is None else self.result_cache.stats(),
            },
        )

    def _check_embedder(self) -> tuple[str, str | None, dict[str, Any]]:
        embedder = self.embedder
        info: dict[str, Any] = {
            "provider": self.settings.embedding_provider,
            "model": embedder.model_name,
            "state": embedder.state,
            "load_time_s": embedder.load_time_s,
            "backend": embedder.backend,  # onnx or torch (EMBEDDING_BACKEND), once loaded
            "onnx_export": embedder.onnx_export,  # a first start's export for the next
        }
        if embedder.state == "failed":
            return "unhealthy", embedder.error, info
        if embedder.state == "loading":
            return "degraded", "the embedding model is still loading", info
        info["dimension"] = embedder.dimension
        return "healthy", None, info

    @cached_property
    def _llm_probe(self) -> LlmProbe:
        return LlmProbe(self.settings)

    def _check_llm(self) -> tuple[str, str | None, dict[str, Any]]:
        """The LLM server, probed (cached briefly); healthy without a probe when none is configured."""
        verdict = self._llm_probe.check()
        return verdict.status, verdict.error, verdict.details

    def _check_vector_store(self) -> tuple[str, str | None, dict[str, Any]]:
        """The store's sizes, and each technique index's state per collection (degraded if one failed)."""
        details = self.store.stats() if access.sees_everything() else self._granted_sizes()
        build = self.index_build_state()
        details["index_build"] = build
        failed = [
            f"the {technique} index of {collection} failed: {state['error']}"
            for collection, states in build["collections"].items()
            for technique, state in states.items()
            if state["state"] == "failed"
        ]
        return ("degraded", "; ".join(failed), details) if failed else ("healthy", None, details)

    def _granted_sizes(self) -> dict[str, Any]:
        """The sizes of the caller's granted collections, for a key restricted to some collections.

        Such a key is not shown the others (store totals, GraphRAG's per-collection counts) nor where the
        store keeps its files and what it holds in memory, which are the operator's (local user, admins).
        """
        granted = [c for c in self.store.list_collections() if access.can_see(c.id)]
        return {
            "backend": self.store.backend_name,
            "collections": len(granted),
            "documents": sum(c.document_count for c in granted),
            "chunks": sum(c.chunk_count for c in granted),
        }

    def index_build_state(self) -> dict[str, Any]:
        """INDEX_BUILD, documents queued, and per collection each technique index's state.

        ready; building (indexed_documents of documents); failed (error); incomplete (nothing is building
        it: inline builds, a technique served after the collection was ingested, an eval that scored other
        techniques, or a CLI command that builds no index of this collection: `iris-rag reindex`).
        """
        builder = self.index_builder
        collections: dict[str, dict[str, Any]] = {}
        for collection in self.store.list_collections():
            if not access.can_see(collection.id):
                continue
            if builder is not None:
                states = builder.state(collection.id, collection.document_count)
            else:
                states = {}
                for name, pipeline in sorted(self.pipelines.items()):
                    index = pipeline.technique_index()
                    if index is None or not isinstance(index, DocumentCoverage):
                        continue
                    indexed = index.indexed_documents(collection.id)
                    ready = indexed >= collection.document_count
                    states[name] = {
                        "state": "ready" if ready else "incomplete",
                        "indexed_documents": indexed,
                        "documents": collection.document_count,
                    }
            if states:
                collections[collection.id] = states
        return {
            "mode": self.settings.index_build,
            "queued_documents": 0 if builder is None else builder.queued_documents(),
            "collections": collections,
        }


def _check(
    probe: Callable[[], tuple[str, str | None, dict[str, Any]]], include_details: bool
) -> dict[str, Any]:
    """Run one component probe, timing it; an exception makes the component unhealthy."""
    started = time.perf_counter()
    try:
        status, error, details = probe()
    except Exception as exc:
        status, error, details = "unhealthy", f"{type(exc).__name__}: {exc}", {}
    component: dict[str, Any] = {
        "status": status,
        "last_check": _now(),
        "response_time_ms": round((time.perf_counter() - started) * 1000, 3),
        "error_message": error,
    }
    if include_details:
        component["details"] = details
    return component


def _without_correlation(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments less request_id and session_id, which belong to the call, not to the tool's request.

    worker/dispatch.py echoes them in the answer and stores them with the call record.
    """
    return {k: v for k, v in arguments.items() if k not in CORRELATION_FIELDS}


def _technique_names(names: str | list[str] | None) -> list[str] | None:
    """rag_metrics' technique_filter as technique names; a tool name (rag_basic) is its technique's.

    An unknown name is refused: it would filter everything out and read as no traffic.
    """
    if names is None:
        return None
    wanted = [names] if isinstance(names, str) else names
    techniques = [
        name.removeprefix("rag_") if name.removeprefix("rag_") in PIPELINES else name for name in wanted
    ]
    unknown = [name for name in techniques if name not in PIPELINES]
    if unknown:
        msg = f"technique_filter names no technique: {', '.join(unknown)}; known: {', '.join(PIPELINES)}"
        raise InvalidParametersError(msg, {"unknown": unknown, "known": list(PIPELINES)})
    return list(dict.fromkeys(techniques))

"""BasicRAG: the query's embedding, the top_k chunks by exact cosine similarity."""

from __future__ import annotations

from typing import Any

from iris_rag.pipeline import Pipeline, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.stores.base import CollectionInfo
from iris_rag.stores.filters import parse_filters


class BasicPipeline(Pipeline):
    """Dense retrieval only; the baseline every other technique is measured against."""

    technique = "basic"

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: Any
    ) -> Retrieval:
        """Embed the query and take the nearest chunks."""
        store = self.context.store
        query_vector = self.context.embedder.encode_query(query)
        hits = store.vector_search(collection.id, query_vector, options.top_k, parse_filters(options.filters))
        chunks = store.get_chunks(collection.id, [hit.chunk_id for hit in hits])
        scores = {hit.chunk_id: hit.score for hit in hits}
        return Retrieval(
            documents=[RetrievedDocument(chunk, scores[chunk.chunk_id]) for chunk in chunks],
            documents_searched=store.chunk_count(collection.id),
            technique_specific={"similarity": "cosine", "candidates": len(hits)},
        )

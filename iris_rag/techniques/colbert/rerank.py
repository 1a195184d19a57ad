"""Late interaction for another technique's candidates: rag_hybrid_ifind's `rerank: "colbert"`.

It reads the token vectors rag_colbert's index stores at ingest (every stored token, no threshold: the
settings measured on SciFact train, docs/benchmarks.md) and takes the query's token vectors from the dense
encoder's own forward pass, so the query is encoded once.
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from iris_rag.encoder import token_level
from iris_rag.pipeline import PipelineContext
from iris_rag.stores.base import CollectionInfo
from iris_rag.techniques.colbert.index import QueryEncoding, TokenEncoder, TokenVectorIndex, TokenVectors


class LateInteraction:
    """MaxSim of a query with stored chunks, over the ColBERT token index, for re-ranking."""

    def __init__(self, context: PipelineContext) -> None:
        self.context = context
        self.encoder = TokenEncoder(context.embedder)
        self.index: TokenVectorIndex | None = None
        self._no_storage: str | None = None
        try:
            self.index = TokenVectorIndex(self.encoder, context.store)
        except NotImplementedError as error:  # a backend without rag_colbert's storage
            self._no_storage = str(error)

    def unavailable(self, collection: CollectionInfo) -> str | None:
        """Why this collection's candidates cannot be re-ranked now (None: they can)."""
        if self.index is None:
            return f"this store keeps no ColBERT token vectors ({self._no_storage})"
        if not token_level(self.context.embedder):
            return "the embedding provider gives no word-piece vectors (EMBEDDING_PROVIDER=local needed)"
        indexed = self.index.indexed_documents(collection.id)
        if indexed >= collection.document_count:
            return None
        builder = self.context.index_builder
        if builder is not None and builder.pending(collection.id):
            return (
                f"the ColBERT token index is still being built ({indexed} of {collection.document_count} "
                "documents)"
            )
        return (
            f"the ColBERT token index covers {indexed} of {collection.document_count} documents: serve the "
            f"colbert technique (RAG_TECHNIQUES) and run `iris-rag reindex --collection {collection.id}`"
        )

    def encode_query(self, query: str) -> Future[QueryEncoding]:
        """The query's dense vector and token vectors from one forward pass (TokenEncoder)."""
        return self.encoder.encode_query_shared(query)

    def scores(self, collection_id: str, query: TokenVectors, chunk_ids: list[str]) -> dict[str, float]:
        """Each chunk's MaxSim over every stored token (no threshold), divided by the query's token count.

        The same as batch_maxsim over the dequantized vectors with threshold 0, computed on the int8 codes:
        a chunk's scale is positive, so it multiplies each query token's best match after the maximum, and
        the chunks' codes go through one conversion and one matrix product. A chunk without stored tokens
        is left out; one with no token scores 0.
        """
        if self.index is None:
            return {}
        stored = self.index.load(collection_id, chunk_ids)
        present = [stored[c] for c in chunk_ids if c in stored]
        filled = [t for t in present if t.token_count > 0]
        result = dict.fromkeys((t.chunk_id for t in present), 0.0)
        count = int(query.vectors.shape[0])
        if count == 0 or not filled:
            return result
        codes = np.concatenate([t.codes for t in filled]).astype(np.float32)
        starts = np.cumsum([0] + [t.token_count for t in filled[:-1]])
        scales = np.array([t.scale for t in filled], dtype=np.float32)
        best = np.maximum.reduceat(query.vectors @ codes.T, starts, axis=1) * scales  # (query tokens, chunks)
        totals = np.maximum(best, 0.0).sum(axis=0) / count
        result.update(zip((t.chunk_id for t in filled), totals.tolist(), strict=True))
        return result

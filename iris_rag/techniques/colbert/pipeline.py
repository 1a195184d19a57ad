"""ColBERT: dense candidates re-scored by token-level late interaction (MaxSim), fused with their cosine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from iris_rag.pipeline import Pipeline, PipelineContext, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.retrieval import vocabulary
from iris_rag.stores.base import CollectionInfo
from iris_rag.stores.filters import parse_filters
from iris_rag.stores.technique_index import TechniqueIndex
from iris_rag.stores.versioned import VersionedCache
from iris_rag.techniques.colbert.index import ChunkTokens, TokenEncoder, TokenVectorIndex, used_count

Floats = npt.NDArray[np.float32]

FEEDBACK_CHUNKS = 3
"""Query expansion: the best first-pass chunks the expansion tokens are taken from."""
EXPANSION_TOKENS = 10
"""Query expansion: how many tokens are added."""
EXPANSION_WEIGHT = 0.5
"""Query expansion: the weight of an added token's match (a query token's is 1)."""
MIN_EXPANSION_CHARS = 3
"""Query expansion: shorter word pieces (after '##') say too little to be added."""


class ColbertParams(BaseModel):
    """technique_params of rag_colbert (schema: schemas/tools/rag_colbert.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compression_ratio: float = Field(0.8, ge=0.1, le=1.0)
    max_query_length: int = Field(256, ge=32, le=512)
    interaction_threshold: float = Field(0.5, ge=0, le=1)
    enable_query_expansion: bool = False
    candidate_pool: int = Field(100, ge=10, le=1000)
    dense_weight: float = Field(0.5, ge=0, le=1)


@dataclass(frozen=True, slots=True)
class MaxSim:
    """Late interaction of one query with one document."""

    score: float
    """Sum over the query tokens of weight * best similarity, counting only matches >= the threshold."""
    best: Floats
    """Each query token's best similarity among the document's tokens (before the threshold)."""
    best_index: npt.NDArray[np.intp]
    """The document token each query token matched best."""
    matched: npt.NDArray[np.bool_]
    """Which query tokens reached the threshold."""


def maxsim(query: Floats, document: Floats, threshold: float = 0.0, weights: Floats | None = None) -> MaxSim:
    """ColBERT's MaxSim: for each query token its best dot product with a document token, summed.

    Rows are unit vectors, so a dot product is a cosine. A best match under `threshold` adds nothing.
    """
    count = query.shape[0]
    if count == 0 or document.shape[0] == 0:
        zeros = np.zeros(count, dtype=np.float32)
        return MaxSim(0.0, zeros, np.zeros(count, dtype=np.intp), np.zeros(count, dtype=bool))
    similarities = query @ document.T
    best_index = similarities.argmax(axis=1)
    best = similarities[np.arange(count), best_index].astype(np.float32)
    matched = best >= threshold
    token_weights = np.ones(count, dtype=np.float32) if weights is None else weights
    score = float(np.sum(np.where(matched, best, 0.0) * token_weights))
    return MaxSim(score, best, best_index, matched)


def batch_maxsim(
    query: Floats, documents: list[Floats], threshold: float = 0.0, weights: Floats | None = None
) -> npt.NDArray[np.float64]:
    """maxsim(...).score of many documents at once: one matrix product over all their tokens."""
    scores = np.zeros(len(documents), dtype=np.float64)
    filled = [i for i, d in enumerate(documents) if d.shape[0] > 0]
    if query.shape[0] == 0 or not filled:
        return scores
    stacked = np.concatenate([documents[i] for i in filled])
    starts = np.cumsum([0] + [documents[i].shape[0] for i in filled[:-1]])
    best = np.maximum.reduceat(query @ stacked.T, starts, axis=1)  # (query tokens, documents)
    token_weights = np.ones(query.shape[0], dtype=np.float32) if weights is None else weights
    scores[filled] = (np.where(best >= threshold, best, 0.0) * token_weights[:, None]).sum(axis=0)
    return scores


@dataclass(slots=True)
class _Candidate:
    chunk_id: str
    dense: float
    tokens: ChunkTokens | None
    used: int = 0
    vectors: Floats = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    token_ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    interaction: float = 0.0
    normalized: float = 0.0
    fused: float = 0.0


@dataclass(frozen=True, slots=True)
class _Idf:
    """A collection's word-piece IDF, with what it was read from."""

    idf: npt.NDArray[np.float32]
    chunks: int  # chunks with token rows
    version: int
    created_at: str


class ColbertPipeline(Pipeline):
    """Dense search proposes candidates; token-level late interaction re-scores them."""

    technique = "colbert"
    params_model = ColbertParams
    needs_token_level = True  # token vectors come from the local model's hidden states

    def __init__(self, context: PipelineContext) -> None:
        super().__init__(context)
        self.encoder = TokenEncoder(context.embedder)
        self.index = TokenVectorIndex(self.encoder, context.store)
        # Per collection: the IDF of every word-piece id, read again once the index moved away from it.
        self._idf: VersionedCache[_Idf] = VersionedCache()

    def technique_index(self) -> TechniqueIndex:
        """Token vectors, built at ingest."""
        return self.index

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: ColbertParams
    ) -> Retrieval:
        """Dense candidates, re-scored by MaxSim over their stored token vectors and fused with the cosine."""
        self.require_index(collection)
        store = self.context.store
        pool = max(params.candidate_pool, options.top_k)
        # One forward pass gives the query's token vectors and, for a mean-pooled model, its dense vector.
        encoding = self.encoder.encode_query(query, max_length=params.max_query_length).result()
        query_vector = encoding.dense
        if query_vector is None:
            query_vector = self.context.embedder.encode_query(query)
        hits = store.vector_search(collection.id, query_vector, pool, parse_filters(options.filters))
        idf = self._collection_idf(collection)
        stored = self.index.load(collection.id, [h.chunk_id for h in hits])
        candidates = [_Candidate(h.chunk_id, h.score, stored.get(h.chunk_id)) for h in hits]
        for candidate in candidates:
            _select_tokens(candidate, params.compression_ratio, idf)

        query_tokens = encoding.tokens
        query_words = self.encoder.token_strings(query_tokens.token_ids.tolist())
        full_length = self.encoder.embedder.word_piece_counts([query])[0] + 2

        rows, weights = query_tokens.vectors, np.ones(len(query_words), dtype=np.float32)
        self._score(candidates, rows, weights, params)
        expansion_words: list[str] = []
        if params.enable_query_expansion and candidates:
            extra_rows, extra_ids = _expansion(candidates, set(query_tokens.token_ids.tolist()), idf, self)
            if extra_ids:
                expansion_words = self.encoder.token_strings(extra_ids)
                rows = np.concatenate([rows, extra_rows])
                weights = np.concatenate([weights, np.full(len(extra_ids), EXPANSION_WEIGHT, np.float32)])
                self._score(candidates, rows, weights, params)

        ranked = sorted(candidates, key=lambda c: -c.fused)[: options.top_k]
        chunks = {c.chunk_id: c for c in store.get_chunks(collection.id, [c.chunk_id for c in ranked])}
        labels = [*query_words, *expansion_words]
        documents = [
            RetrievedDocument(
                chunks[c.chunk_id],
                c.fused,
                self._details(c, rows, weights, labels, len(query_words), params),
            )
            for c in ranked
            if c.chunk_id in chunks
        ]
        return Retrieval(
            documents=documents,
            documents_searched=store.chunk_count(collection.id),
            technique_specific={
                "candidates": len(candidates),
                "candidate_pool": pool,
                "query_tokens": query_words,
                "query_token_count": len(query_words),
                "query_truncated": full_length > params.max_query_length,
                "max_query_length": params.max_query_length,
                "compression_ratio": params.compression_ratio,
                "tokens_stored": sum(c.tokens.token_count for c in candidates if c.tokens),
                "tokens_scored": sum(c.used for c in candidates),
                "interaction_threshold": params.interaction_threshold,
                "dense_weight": params.dense_weight,
                "query_expansion": params.enable_query_expansion,
                "expansion_tokens": expansion_words,
                "candidates_without_tokens": sum(1 for c in candidates if c.tokens is None),
                "used_chunk_ids": [d.chunk.chunk_id for d in documents],
            },
        )

    def _score(
        self, candidates: list[_Candidate], rows: Floats, weights: Floats, params: ColbertParams
    ) -> None:
        """Interaction, normalized interaction and fused score of every candidate."""
        raw = batch_maxsim(rows, [c.vectors for c in candidates], params.interaction_threshold, weights)
        total = float(weights.sum())
        for candidate, score in zip(candidates, raw, strict=True):
            candidate.interaction = float(score)
            candidate.normalized = float(score) / total if total > 0 else 0.0
            candidate.fused = (
                params.dense_weight * candidate.dense + (1 - params.dense_weight) * candidate.normalized
            )

    def _details(
        self,
        candidate: _Candidate,
        rows: Floats,
        weights: Floats,
        labels: list[str],
        query_count: int,
        params: ColbertParams,
    ) -> dict[str, Any]:
        """The score breakdown of one result, with each matched query token and its best chunk token."""
        result = maxsim(rows, candidate.vectors, params.interaction_threshold, weights)
        matched = np.flatnonzero(result.matched).tolist()
        words = self.encoder.token_strings(candidate.token_ids[result.best_index[matched]].tolist())
        return {
            "interaction_score": round(candidate.interaction, 6),
            "interaction_normalized": round(candidate.normalized, 6),
            "dense_score": round(candidate.dense, 6),
            "fused_score": round(candidate.fused, 6),
            "matched_query_tokens": [labels[i] for i in matched if i < query_count],
            "token_matches": [
                {
                    "query_token": labels[i],
                    "document_token": word,
                    "similarity": round(float(result.best[i]), 4),
                    **({"expansion": True} if i >= query_count else {}),
                }
                for i, word in zip(matched, words, strict=True)
            ],
            "tokens_stored": candidate.tokens.token_count if candidate.tokens else 0,
            "tokens_used": candidate.used,
        }

    def _collection_idf(self, collection: CollectionInfo) -> npt.NDArray[np.float32]:
        """IDF of every word piece over the collection's chunks, from the index's frequency table.

        Statistics, as the keyword vocabulary's (retrieval/vocabulary.py): a table read is kept while the
        chunks with token rows stay within its STALE_SHARE of the read's count, for fewer than its
        MAX_VERSIONS writes, in the same collection. The count is the index's own, not the collection's:
        the token rows are built in the background, and an IDF read from a half-built index is read again
        as it fills.
        """

        def build() -> _Idf:
            total, frequencies = self.index.frequencies(collection.id)
            counts = np.zeros(self.encoder.vocabulary_size, dtype=np.float64)
            for token, chunks in frequencies.items():
                if token < counts.shape[0]:
                    counts[token] = chunks
            idf = np.log((total + 1) / (counts + 1)).astype(np.float32)
            return _Idf(idf, total, collection.version, collection.created_at)

        def update(_: int, held: _Idf) -> _Idf | None:
            if held.created_at != collection.created_at:
                return None
            chunks = self.index.indexed_chunks(collection.id)
            return (
                held
                if vocabulary.still_close(held.chunks, held.version, chunks, collection.version)
                else None
            )

        return self._idf.get(collection.id, collection.version, build, update).idf


def _select_tokens(candidate: _Candidate, ratio: float, idf: npt.NDArray[np.float32]) -> None:
    """Keep the ceil(ratio * n) rarest tokens of the chunk (collection IDF; ties keep text order)."""
    tokens = candidate.tokens
    if tokens is None:
        return
    keep = used_count(tokens.token_count, ratio)
    order = np.argsort(-idf[tokens.token_ids], kind="stable")[:keep]
    candidate.used = keep
    candidate.token_ids = tokens.token_ids[order]
    candidate.vectors = tokens.vectors()[order]


def _expansion(
    candidates: list[_Candidate], query_ids: set[int], idf: npt.NDArray[np.float32], pipeline: ColbertPipeline
) -> tuple[Floats, list[int]]:
    """Pseudo-relevance feedback: the strongest tokens of the best first-pass chunks, as extra query rows.

    A token's strength is how often it occurs in those chunks times its collection IDF; its query row is
    the mean of its vectors there, normalized.
    """
    feedback = sorted(candidates, key=lambda c: -c.fused)[:FEEDBACK_CHUNKS]
    strength: dict[int, float] = {}
    vectors: dict[int, list[Floats]] = {}
    for candidate in feedback:
        words = pipeline.encoder.token_strings(candidate.token_ids.tolist())
        for token, word, vector in zip(candidate.token_ids.tolist(), words, candidate.vectors, strict=True):
            if token in query_ids or len(word.removeprefix("##")) < MIN_EXPANSION_CHARS:
                continue
            strength[token] = strength.get(token, 0.0) + float(idf[token])
            vectors.setdefault(token, []).append(vector)
    chosen = sorted(strength, key=lambda t: (-strength[t], t))[:EXPANSION_TOKENS]
    if not chosen:
        return np.zeros((0, 0), dtype=np.float32), []
    rows = np.stack([np.mean(vectors[t], axis=0) for t in chosen]).astype(np.float32)
    rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return rows, chosen

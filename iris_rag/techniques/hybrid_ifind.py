"""HybridIFind: a dense leg and a keyword (BM25) leg over the store's full-text index, fused."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from iris_rag.pipeline import Pipeline, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.retrieval.fusion import (
    FusedScore,
    Reranked,
    late_interaction_rerank,
    reciprocal_rank_fusion,
    weighted_fusion,
)
from iris_rag.retrieval.keyword import FuzzyRepair, repair_terms, unknown_terms
from iris_rag.retrieval.vocabulary import Vocabularies
from iris_rag.stores.base import CollectionInfo, KeywordQuery, KeywordScoring, ScoredChunk, StoredChunk
from iris_rag.stores.filters import MetadataFilter, parse_filters
from iris_rag.techniques.colbert.rerank import LateInteraction
from iris_rag.text import query_terms

RERANK_DEPTH = 100
"""rerank "colbert": the fused ranking's first candidates re-scored (the client's candidate_pool default)."""

# A metadata field name (or "title") that keyword_boost_fields may name.
FIELD_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"


class HybridParams(BaseModel):
    """technique_params of rag_hybrid_ifind (schema: schemas/tools/rag_hybrid_ifind.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fusion_method: Literal["weighted", "rrf"] = "weighted"
    vector_weight: float = Field(0.5, ge=0, le=1)
    keyword_weight: float = Field(0.5, ge=0, le=1)
    rrf_k: int = Field(60, ge=1, le=1000)
    candidate_pool: int = Field(100, ge=10, le=1000)
    enable_fuzzy_matching: bool = False
    keyword_boost_fields: Annotated[
        tuple[Annotated[str, StringConstraints(pattern=FIELD_NAME)], ...],
        Field(max_length=10, json_schema_extra={"uniqueItems": True}),
    ] = ()
    keyword_boost: float = Field(2.0, ge=1, le=10)
    keyword_scoring: KeywordScoring = "flat"
    rerank: Literal["none", "colbert"] = "none"

    @field_validator("keyword_boost_fields")
    @classmethod
    def _distinct_fields(cls, fields: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(fields)) != len(fields):
            msg = "keyword_boost_fields names a field twice"
            raise ValueError(msg)
        return fields

    @model_validator(mode="after")
    def _one_leg_at_least(self) -> HybridParams:
        if self.vector_weight == 0 and self.keyword_weight == 0:
            msg = "vector_weight and keyword_weight cannot both be 0"
            raise ValueError(msg)
        return self


class HybridIFindPipeline(Pipeline):
    """Dense cosine and BM25 candidates, fused by weighted normalized scores or reciprocal ranks."""

    technique = "hybrid_ifind"
    params_model = HybridParams

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The keyword index's vocabulary, for fuzzy repair.
        self._vocabularies = Vocabularies(self.context.store)
        self._late_interaction: LateInteraction | None = None  # rerank "colbert": made when first asked

    def _late(self) -> LateInteraction:
        if self._late_interaction is None:
            self._late_interaction = LateInteraction(self.context)
        return self._late_interaction

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: HybridParams
    ) -> Retrieval:
        """Run both legs with the same filter, fuse, and explain every score."""
        store = self.context.store
        metadata_filter = parse_filters(options.filters)
        pool = max(params.candidate_pool, options.top_k)

        # The query embeds on the encode thread while this thread runs the keyword leg in SQLite: the
        # two overlap instead of adding up. A leg weighted 0 is switched off: its candidates could only
        # ever score 0 (the vector still gives every keyword hit its cosine for the score breakdown).
        # Re-ranking takes the query's token vectors from the same forward pass.
        skipped = self._late().unavailable(collection) if params.rerank == "colbert" else None
        pending_tokens = (
            self._late().encode_query(query) if params.rerank == "colbert" and skipped is None else None
        )
        pending_vector = None if pending_tokens else self.context.embedder.encode_query_async(query)
        terms = query_terms(query)
        repair = FuzzyRepair()
        keyword_hits: list[ScoredChunk] = []
        if params.keyword_weight > 0:
            if params.enable_fuzzy_matching and terms:
                repair = self._repair(collection, terms)
            keyword_hits = self._keyword_leg(
                collection.id, terms + repair.extra_terms, pool, metadata_filter, params
            )
        encoding = pending_tokens.result() if pending_tokens else None
        if encoding is not None and encoding.dense is not None:
            query_vector = encoding.dense
        else:
            query_vector = (pending_vector or self.context.embedder.encode_query_async(query)).result()
        dense_hits: list[ScoredChunk] = []
        if params.vector_weight > 0:
            dense_hits = store.vector_search(collection.id, query_vector, pool, metadata_filter)

        # Exact cosine for every candidate, including those only the keyword leg found.
        dense = {hit.chunk_id: hit.score for hit in dense_hits}
        missing = [hit.chunk_id for hit in keyword_hits if hit.chunk_id not in dense]
        dense.update(store.vector_scores(collection.id, query_vector, missing))
        keyword = {hit.chunk_id: hit.score for hit in keyword_hits}
        fuse = reciprocal_rank_fusion if params.fusion_method == "rrf" else weighted_fusion
        extra = {"k": params.rrf_k} if params.fusion_method == "rrf" else {}
        fused = fuse(
            dense,
            keyword,
            [hit.chunk_id for hit in dense_hits],
            [hit.chunk_id for hit in keyword_hits],
            vector_weight=params.vector_weight,
            keyword_weight=params.keyword_weight,
            **extra,
        )
        ranked: list[FusedScore] | list[Reranked] = fused[: options.top_k]
        rerank: dict[str, Any] = {"rerank": params.rerank}
        if encoding is not None:
            # The first RERANK_DEPTH are re-scored; a larger top_k gets the rest in the fusion's order.
            head = fused[:RERANK_DEPTH]
            late = self._late().scores(collection.id, encoding.tokens, [f.chunk_id for f in head])
            ranked = late_interaction_rerank(fused[: max(RERANK_DEPTH, options.top_k)], late, RERANK_DEPTH)
            ranked = ranked[: options.top_k]
            rerank.update(rerank_applied=True, reranked_candidates=len(head))
        elif params.rerank != "none":
            rerank.update(rerank_applied=False, rerank_skipped=f"{skipped}; ranked by the fusion alone")

        chunks = {c.chunk_id: c for c in store.get_chunks(collection.id, [f.chunk_id for f in ranked])}
        documents = [
            RetrievedDocument(
                chunks[f.chunk_id], f.score if isinstance(f, Reranked) else f.fused_score, f.as_dict()
            )
            for f in ranked
            if f.chunk_id in chunks
        ]
        return Retrieval(
            documents=documents,
            documents_searched=store.chunk_count(collection.id),
            technique_specific={
                "fusion_method": params.fusion_method,
                "vector_weight": params.vector_weight,
                "keyword_weight": params.keyword_weight,
                **({"rrf_k": params.rrf_k} if params.fusion_method == "rrf" else {}),
                "keyword_terms": terms,
                "fuzzy_expansions": repair.expansions,
                "keyword_boost_fields": list(params.keyword_boost_fields),
                "keyword_scoring": params.keyword_scoring,
                **rerank,
                "dense_candidates": len(dense_hits),
                "keyword_candidates": len(keyword_hits),
                "used_chunk_ids": [d.chunk.chunk_id for d in documents],
            },
        )

    def _keyword_leg(
        self,
        collection_id: str,
        terms: list[str],
        pool: int,
        metadata_filter: MetadataFilter | None,
        params: HybridParams,
    ) -> list[ScoredChunk]:
        """BM25 candidates; a title boost weights the FTS column, a metadata-field boost rescales hits."""
        if not terms:
            return []
        store = self.context.store
        title_weight = params.keyword_boost if "title" in params.keyword_boost_fields else 1.0
        query = KeywordQuery.of(terms, title_weight, params.keyword_scoring)
        hits = store.keyword_search(collection_id, query, pool, metadata_filter)
        if params.vector_weight > 0:
            # A chunk only terms in half the chunks or more matched ("my" in a small FAQ) has no keyword
            # evidence; divided by the best such score it would outweigh the dense leg. Alone, the keyword
            # leg keeps them: BM25's order is all there is (a one-chunk collection's terms are all floored).
            hits = query.with_evidence(hits)
        metadata_fields = [f for f in params.keyword_boost_fields if f != "title"]
        if not metadata_fields or not hits:
            return hits
        chunks = {c.chunk_id: c for c in store.get_chunks(collection_id, [h.chunk_id for h in hits])}
        boosted = [
            ScoredChunk(hit.chunk_id, hit.score * params.keyword_boost)
            if _metadata_mentions(chunks.get(hit.chunk_id), metadata_fields, terms)
            else hit
            for hit in hits
        ]
        return sorted(boosted, key=lambda h: -h.score)

    def _repair(self, collection: CollectionInfo, terms: list[str]) -> FuzzyRepair:
        """Fuzzy-repair the terms that match nothing in this collection."""
        vocabulary = self._vocabularies.get(collection)
        if unknown_terms(terms, vocabulary):  # unknown in a recent read: maybe written since; ask the current
            vocabulary = self._vocabularies.get(collection, current=True)
        return repair_terms(unknown_terms(terms, vocabulary), vocabulary)


def _metadata_mentions(chunk: StoredChunk | None, fields: list[str], terms: list[str]) -> bool:
    """Whether any query term occurs in any of the named metadata fields of the chunk's document."""
    if chunk is None:
        return False
    values = " ".join(str(chunk.metadata.get(f, "")) for f in fields).lower()
    return any(term in query_terms(values) for term in terms)


__all__ = ["FusedScore", "HybridIFindPipeline", "HybridParams"]

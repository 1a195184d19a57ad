"""HyDE (Gao et al. 2022): search with the embedding of a hypothetical document that would answer the query.

A document that answers the query sits closer to the relevant documents than the short query does. With
an LLM configured it writes the hypothetical passage ("llm"), which is embedded (in sentence-aligned
segments when it is longer than the model reads at once, their vectors averaged, as the paper averages
several hypotheses). Without one, the hypothesis is the mean of the stored vectors of the top chunks of
a first pass by rag_hybrid_ifind ("prf": pseudo-relevance feedback, Rocchio's method on embeddings), so
nothing is encoded but the query. The hypothesis vector is used alone, averaged with the query's embedding,
or mixed with it by hypothesis_weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from iris_rag.cancellation import check_cancelled
from iris_rag.llm import TechniqueLLM, strip_label
from iris_rag.pipeline import Pipeline, PipelineContext, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.stores.base import CollectionInfo
from iris_rag.stores.filters import parse_filters
from iris_rag.techniques.hybrid_ifind import HybridIFindPipeline, HybridParams
from iris_rag.text import split_sentences

Vector = npt.NDArray[np.float32]

# all-MiniLM-L6-v2 reads at most 256 word pieces: a longer hypothesis is embedded in sentence-aligned
# segments of at most this many, whose unit vectors are averaged (weighted by their length).
SEGMENT_TOKENS = 200
# The LLM may write up to this many tokens per requested token; the text is then cut to the length.
LLM_TOKEN_ALLOWANCE = 1.25
# Texts per encoder batch at query time (an LLM hypothesis's segments). The encoder pads a batch to its
# longest text; when the no-LLM hypothesis still encoded the first pass's sentences (a few word pieces to
# 80 each), one batch of all of them was mostly padding, and batches of 4 (the encoder sorts texts by
# length first) gave the same vectors (to 2e-7) in a quarter of the time (docs/benchmarks.md, "Where
# rag_basic's time goes").
QUERY_TIME_BATCH = 4

HYPOTHESIS_PROMPT = (
    "Write a passage that answers the question or addresses the claim you are given, in the style of the "
    "document that would contain the answer (for a scientific claim, an excerpt of a paper's abstract). "
    "State specific findings plainly; do not hedge, and do not say that the passage is hypothetical. "
    "Reply with the passage only."
)


class HydeParams(BaseModel):
    """technique_params of rag_hyde (schema: schemas/tools/rag_hyde.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    generate_hypothetical: bool = True
    hypothesis_length: int = Field(200, ge=50, le=500)
    combine_strategy: Literal["auto", "replace", "combine", "weighted"] = "auto"
    hypothesis_weight: float = Field(0.4, ge=0, le=1)
    prf_depth: int = Field(1, ge=1, le=20)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """The hypothetical document, how it was made, and its embedding."""

    text: str | None  # None for the first pass's mean vector, which no text was embedded for
    source: str
    tokens: int
    segments: int  # segments embedded (llm), chunk vectors averaged (prf)
    vector: Vector
    report: dict[str, Any]


def combined_vector(query: Vector, hypothesis: Vector, weight: float) -> Vector:
    """(1 - weight) * query + weight * hypothesis, back to unit length (cosine stays a dot product)."""
    mixed = (1.0 - weight) * query.astype(np.float32) + weight * hypothesis.astype(np.float32)
    norm = float(np.linalg.norm(mixed))
    result: Vector = (mixed / norm if norm > 0 else query).astype(np.float32)
    return result


def effective_strategy(params: HydeParams, source: str) -> str:
    """auto: replace for an LLM-written hypothesis (HyDE as published), else weighted (the feedback vector).

    Without an LLM the first pass's mean vector alone ranks below the mix (it drifts to whatever the
    first pass found); mixed in at hypothesis_weight 0.4 from the hybrid first pass's top chunk it ranked
    best on SciFact train (docs/techniques/hyde.md).
    """
    if params.combine_strategy != "auto":
        return params.combine_strategy
    return "replace" if source == "llm" else "weighted"


def hypothesis_weight(params: HydeParams, source: str = "llm") -> float:
    """The weight the strategy gives the hypothesis: replace 1, combine 0.5, weighted hypothesis_weight."""
    strategy = effective_strategy(params, source)
    if strategy == "replace":
        return 1.0
    if strategy == "combine":
        return 0.5
    return params.hypothesis_weight


class HydePipeline(Pipeline):
    """Embed a hypothetical answer document (LLM-written, or built from the first pass) and search with it."""

    technique = "hyde"
    params_model = HydeParams

    def __init__(self, context: PipelineContext) -> None:
        super().__init__(context)
        self._llm = TechniqueLLM(context.settings)
        # The no-LLM hypothesis's first pass: rag_hybrid_ifind at its defaults.
        self._first_pass = HybridIFindPipeline(context)

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: HydeParams
    ) -> Retrieval:
        """Search with the query's, the hypothesis's or a mixed embedding; report the hypothesis."""
        store = self.context.store
        metadata_filter = parse_filters(options.filters)
        query_vector = self.context.embedder.encode_query(query)
        specific: dict[str, Any] = {"generate_hypothetical": params.generate_hypothetical}
        if not params.generate_hypothetical:
            search_vector, hypothesis = query_vector, None
            specific |= {"hypothesis": None, "hypothesis_source": "none", "combine_strategy": "query_only"}
        else:
            hypothesis = self.hypothesis(query, collection, params, options.filters)
            weight = hypothesis_weight(params, hypothesis.source)
            search_vector = combined_vector(query_vector, hypothesis.vector, weight)
            specific |= {"hypothesis": hypothesis.text, "hypothesis_source": hypothesis.source}
            if hypothesis.text is not None:
                specific |= {
                    "hypothesis_tokens": hypothesis.tokens,
                    "hypothesis_length": params.hypothesis_length,
                    "hypothesis_segments": hypothesis.segments,
                }
            specific |= {
                "combine_strategy": effective_strategy(params, hypothesis.source),
                "hypothesis_weight": weight,
                "query_hypothesis_cosine": round(float(query_vector @ hypothesis.vector), 6),
                **hypothesis.report,
            }
            if not hypothesis.segments:
                specific["note"] = (
                    "the hypothesis is empty (nothing in the first pass), so the query alone was searched"
                )

        hits = store.vector_search(collection.id, search_vector, options.top_k, metadata_filter)
        chunks = store.get_chunks(collection.id, [hit.chunk_id for hit in hits])
        scores = {hit.chunk_id: hit.score for hit in hits}
        query_cosines = store.vector_scores(collection.id, query_vector, list(scores))
        hypothesis_cosines = (
            store.vector_scores(collection.id, hypothesis.vector, list(scores)) if hypothesis else {}
        )
        documents = [
            RetrievedDocument(
                chunk,
                scores[chunk.chunk_id],
                {
                    "query_cosine": round(query_cosines.get(chunk.chunk_id, 0.0), 6),
                    "hypothesis_cosine": round(hypothesis_cosines.get(chunk.chunk_id, 0.0), 6),
                }
                if hypothesis
                else {},
            )
            for chunk in chunks
        ]
        specific["candidates"] = len(hits)
        return Retrieval(documents, store.chunk_count(collection.id), specific)

    def hypothesis(
        self, query: str, collection: CollectionInfo, params: HydeParams, filters: dict[str, Any] | None
    ) -> Hypothesis:
        """The LLM's hypothetical passage, cut and embedded; or, without one, the first pass's mean vector."""
        words = max(1, round(params.hypothesis_length * 0.75))
        produced = self._llm.produce(
            HYPOTHESIS_PROMPT,
            f"Write about {words} words ({params.hypothesis_length} tokens).\n\nQuery: {query}",
            max_tokens=round(params.hypothesis_length * LLM_TOKEN_ALLOWANCE),
            fallback_name="prf",
            fallback=str,
            clean=strip_label,
        )
        check_cancelled()
        if produced.source != "llm":
            hypothesis = self.feedback(query, collection, params.prf_depth, filters)
            if produced.error:
                hypothesis.report["llm_error"] = produced.error
            return hypothesis
        text = self.cut(produced.text, params.hypothesis_length)
        vector, segments = self.embed_long(text)
        return Hypothesis(text, produced.source, self.count_tokens(text), segments, vector, {})

    def feedback(
        self, query: str, collection: CollectionInfo, depth: int, filters: dict[str, Any] | None
    ) -> Hypothesis:
        """The no-LLM hypothesis: the mean of the unit vectors of rag_hybrid_ifind's top `depth` chunks.

        The vectors are the ones stored at ingest, so this costs a hybrid search and no encode (the
        query's vector is the one this call already made). The hybrid first pass finds a relevant chunk
        more often than the dense one, and the feedback is only as good as what it averages: on SciFact
        train, 0.728 nDCG@10 against 0.681 from a dense first pass. An earlier pseudo-document of the first
        pass's sentences, embedded per query, was 10 times slower and ranked lower (docs/techniques/hyde.md).
        """
        store = self.context.store
        options = QueryOptions(top_k=depth, generate=False, filters=filters)
        first = self._first_pass.retrieve(query, collection, options, HybridParams()).documents
        chunk_ids = [document.chunk.chunk_id for document in first]
        stored = store.chunk_vectors(collection.id, chunk_ids)
        report: dict[str, Any] = {
            "prf_first_pass": "rag_hybrid_ifind",
            "prf_documents": list(dict.fromkeys(document.chunk.document_id for document in first)),
            "prf_chunks": [c for c in chunk_ids if c in stored],
        }
        vectors = [stored[c].astype(np.float32) for c in chunk_ids if c in stored]
        if not vectors:
            return Hypothesis(
                None, "prf", 0, 0, np.zeros(self.context.embedder.dimension, dtype=np.float32), report
            )
        matrix = np.stack(vectors)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        mean = (matrix / np.where(norms > 0, norms, 1.0)).mean(axis=0)
        norm = float(np.linalg.norm(mean))
        vector: Vector = (mean / norm if norm > 0 else mean).astype(np.float32)
        return Hypothesis(None, "prf", 0, len(vectors), vector, report)

    def count_tokens(self, text: str) -> int:
        """Word pieces of the embedding model's tokenizer (what "tokens" means for hypothesis_length)."""
        return self.token_counts([text])[0]

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text (counted where the shared tokenizer is safe to use)."""
        return self.context.embedder.word_piece_counts(texts)

    def cut(self, text: str, length: int) -> str:
        """The text cut to at most `length` tokens: whole sentences (the first cut if it alone is longer)."""
        sentences = [sentence.text for sentence in split_sentences(text)]
        kept: list[str] = []
        used = 0
        for sentence, tokens in zip(sentences, self.token_counts(sentences), strict=True):
            if used + tokens > length:
                if not kept:
                    kept.append(self._truncate(sentence, length))
                break
            kept.append(sentence)
            used += tokens
        return " ".join(kept)

    def _truncate(self, text: str, length: int) -> str:
        def truncate(model: Any) -> str:
            pieces = model.tokenizer.tokenize(text)[:length]
            return str(model.tokenizer.convert_tokens_to_string(pieces))

        return self.context.embedder.run_with_model(truncate, single=True).result()

    def embed_long(self, text: str) -> tuple[Vector, int]:
        """A unit vector for any length: sentence-aligned segments of SEGMENT_TOKENS, averaged by length."""
        if not text.strip():
            return np.zeros(self.context.embedder.dimension, dtype=np.float32), 0
        segments: list[tuple[str, int]] = []
        current: list[str] = []
        used = 0
        sentences = [sentence.text for sentence in split_sentences(text)]
        for sentence, tokens in zip(sentences, self.token_counts(sentences), strict=True):
            if current and used + tokens > SEGMENT_TOKENS:
                segments.append((" ".join(current), used))
                current, used = [], 0
            current.append(sentence)
            used += tokens
        if current:
            segments.append((" ".join(current), used))
        vectors = self.context.embedder.encode(
            [segment for segment, _ in segments], batch_size=QUERY_TIME_BATCH
        )
        weights = np.array([max(tokens, 1) for _, tokens in segments], dtype=np.float32)
        mean = (vectors * weights[:, None]).sum(axis=0)
        norm = float(np.linalg.norm(mean))
        result: Vector = (mean / norm if norm > 0 else mean).astype(np.float32)
        return result, len(segments)

"""Corrective RAG (CRAG, Yan et al. 2024): judge the first retrieval, correct it when it looks wrong.

A retrieval evaluator turns features of the first pass (dense search, plus a keyword search used as a
second opinion) into a calibrated confidence that a relevant document is in the top 10. As in the paper,
the confidence gives one of three verdicts: correct (>= confidence_threshold: the first pass is kept),
ambiguous (the first pass is kept as one leg and fused with the corrected retrieval) or incorrect
(< incorrect_threshold: the first pass is dropped and only the corrected retrieval counts). The
correction is a query rewrite, an RM3 expansion or knowledge refinement into sentence strips, and may
add results from a registered web-search provider.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from iris_rag.cancellation import check_cancelled
from iris_rag.errors import InvalidParametersError
from iris_rag.llm import Produced, TechniqueLLM, first_line
from iris_rag.pipeline import Pipeline, PipelineContext, QueryOptions, Retrieval, RetrievedDocument
from iris_rag.retrieval.fusion import WeightedLeg, weighted_sum
from iris_rag.retrieval.vocabulary import Vocabularies
from iris_rag.stores.base import CollectionInfo, KeywordQuery, ScoredChunk, StoredChunk
from iris_rag.stores.filters import MetadataFilter, parse_filters
from iris_rag.text import STOPWORDS, embedding_text, query_terms, split_sentences, stem

Verdict = Literal["correct", "ambiguous", "incorrect"]
Vector = npt.NDArray[np.float32]

# --- The retrieval evaluator -------------------------------------------------------------------------
# Logistic calibration, fit by `bench/calibrate_crag.py` on the SciFact *train* split (809 judged claims,
# qrels/train.tsv; never on test) against "a relevant document is among the dense top 10" (81% of them),
# Newton's method with a 1e-3 L2 penalty. The features were chosen by 5-fold cross-validated log-loss
# over every subset of {top-1 cosine, margin, query_overlap, keyword_agreement, top1_in_keyword}: these
# four were best (log-loss 0.362, AUC 0.829; the top-1 cosine added nothing once the margin was in).
# Out-of-fold, the confidence is calibrated: bins of mean confidence 0.31 / 0.49 / 0.72 / 0.86 / 0.96
# held a relevant document in 32% / 50% / 69% / 89% / 95% of their queries.
EVALUATOR_INTERCEPT = -1.793746
EVALUATOR_WEIGHTS: dict[str, float] = {
    "margin": 12.922018,
    "query_overlap": 1.331155,
    "keyword_agreement": 1.333594,
    "top1_in_keyword": 0.932750,
}
EVALUATOR_MODEL = "logistic regression, fit on SciFact train by bench/calibrate_crag.py"
EVALUATOR_DEPTH = 10  # "relevant in the top 10": the agreement features compare top-10 document lists
MARGIN_RANK = 5  # margin = cosine of the best document - cosine of the 5th
OVERLAP_DOCUMENTS = 3  # query_overlap looks at the best chunk of the top 3 documents

# --- Corrections (constants tuned on SciFact train; see docs/techniques/crag.md) ------------------------
CANDIDATE_POOL = 100  # chunks taken from each leg before fusion (at least top_k)
# Leg weights by verdict: ambiguous keeps the first pass as half of the evidence, incorrect drops it.
LEG_WEIGHTS: dict[str, dict[str, float]] = {
    "ambiguous": {"first_pass": 0.5, "corrected_dense": 0.25, "corrected_keyword": 0.25},
    "incorrect": {"first_pass": 0.0, "corrected_dense": 0.5, "corrected_keyword": 0.5},
}
STRIP_LEG_WEIGHTS: dict[str, dict[str, float]] = {
    "ambiguous": {"first_pass": 0.5, "strips": 0.5},
    "incorrect": {"first_pass": 0.0, "strips": 1.0},
}
GENERIC_TERM_SHARE = 0.2  # the keyword reformulation drops terms found in more than 20% of chunks
GENERIC_TERM_MIN_CHUNKS = 10  # ... and in more than 10: in a small collection no term is generic
FEEDBACK_DOCUMENTS = 5  # RM3: feedback documents, expansion terms, weight of the original query
FEEDBACK_TERMS = 10
ORIGINAL_QUERY_WEIGHT = 0.7
FEEDBACK_TERM_SHARE = 0.1  # RM3 ignores terms found in more than 10% of chunks
MAX_TERM_REPEAT = 5  # term weights reach FTS5 as repeated phrases: BM25 sums repeated phrases
WEB_RESULTS_MAX = 10

REWRITE_PROMPT = (
    "You rewrite search queries for a retrieval system over a document collection. A first search for the "
    "user's query found nothing convincing. Write one better search query with the same meaning: name the "
    "key entities and technical terms explicitly, expand abbreviations, add the words a relevant document "
    "would use, and drop filler. Reply with the rewritten query only, on one line."
)
REWRITE_MAX_TOKENS = 96


# --- Web search providers ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WebResult:
    """One result of a web-search provider."""

    url: str
    title: str
    content: str


class WebSearchProvider(Protocol):
    """Searches outside the collection; results join the corrected retrieval when confidence is low."""

    def search(self, query: str, top_k: int) -> list[WebResult]:
        """At most top_k results for the query, best first."""


_PROVIDERS: dict[str, WebSearchProvider] = {}
_PROVIDERS_LOCK = threading.Lock()
_PROVIDER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def register_search_provider(name: str, provider: WebSearchProvider) -> None:
    """Make a provider available to rag_crag's enable_web_search under `name` (replacing one so named)."""
    if not _PROVIDER_NAME.match(name):
        msg = f"invalid search provider name {name!r}: letters, digits, '_', '.', '-' (at most 64)"
        raise ValueError(msg)
    with _PROVIDERS_LOCK:
        _PROVIDERS[name] = provider


def unregister_search_provider(name: str) -> None:
    """Remove a provider (no error if it was not registered)."""
    with _PROVIDERS_LOCK:
        _PROVIDERS.pop(name, None)


def registered_search_providers() -> list[str]:
    """The names of the registered providers, sorted."""
    with _PROVIDERS_LOCK:
        return sorted(_PROVIDERS)


def resolve_search_provider(name: str | None) -> tuple[str, WebSearchProvider]:
    """The provider to call: the one named, or the only one registered; INVALID_PARAMETERS otherwise."""
    with _PROVIDERS_LOCK:
        providers = dict(_PROVIDERS)
    if name is None:
        if len(providers) == 1:
            return next(iter(providers.items()))
        if not providers:
            msg = (
                "enable_web_search is true but no web-search provider is registered on this server "
                "(none ships with iris-rag; register one with iris_rag.techniques.crag."
                "register_search_provider), so the correction cannot search the web"
            )
        else:
            listed = ", ".join(sorted(providers))
            msg = f"several web-search providers are registered ({listed}): name one in web_search_provider"
        raise InvalidParametersError(msg, {"registered_providers": sorted(providers)})
    if name not in providers:
        msg = f"no web-search provider named {name!r} (registered: {', '.join(sorted(providers)) or 'none'})"
        raise InvalidParametersError(msg, {"registered_providers": sorted(providers)})
    return name, providers[name]


# --- Parameters ----------------------------------------------------------------------------------------
class CragParams(BaseModel):
    """technique_params of rag_crag (schema: schemas/tools/rag_crag.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    confidence_threshold: float = Field(0.8, ge=0, le=1)
    incorrect_threshold: float = Field(0.4, ge=0, le=1)
    correction_strategy: Literal["rewrite", "expand", "filter"] = "rewrite"
    enable_web_search: bool = False
    web_search_provider: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
    strip_threshold: float = Field(0.25, ge=0, le=1)

    @property
    def effective_incorrect_threshold(self) -> float:
        """incorrect_threshold capped at confidence_threshold, so every pair in 0..1 works.

        Below it the verdict is incorrect, at or above confidence_threshold correct, between them ambiguous:
        with confidence_threshold 0.3 and the default incorrect_threshold 0.4, nothing is ambiguous.
        """
        return min(self.incorrect_threshold, self.confidence_threshold)


# --- Evaluator features ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Assessment:
    """The evaluator's features of one ranking and the calibrated confidence they give."""

    features: dict[str, float]
    confidence: float

    def report(self) -> dict[str, float]:
        """Rounded features for technique_specific."""
        return {name: round(value, 6) for name, value in self.features.items()}


def calibrated_confidence(features: dict[str, float]) -> float:
    """The logistic model: P(a relevant document is in the top 10 | features)."""
    z = EVALUATOR_INTERCEPT + sum(weight * features[name] for name, weight in EVALUATOR_WEIGHTS.items())
    return 1.0 / (1.0 + math.exp(-z))


def stems_of(text: str) -> set[str]:
    """The Porter stems of a text's terms, stopwords removed (as the full-text index stores them)."""
    return {stem(term) for term in query_terms(text)}


def evaluator_features(
    query_stems: set[str],
    ranked: list[tuple[StoredChunk, float]],
    keyword_documents: list[str],
    idf: dict[str, float],
) -> dict[str, float]:
    """The evaluator's features of a ranking of distinct documents (best chunk, cosine to the query).

    margin: cosine of the best document minus that of the 5th (the last, with fewer). query_overlap:
    the IDF-weighted share of the query's terms found in the top 3 documents. keyword_agreement: the
    share of the top-10 documents that a BM25 search for the query also ranks in its top 10.
    top1_in_keyword: 1 when the best document is in that BM25 top 10.
    """
    if not ranked:
        return dict.fromkeys(EVALUATOR_WEIGHTS, 0.0)
    top = ranked[:EVALUATOR_DEPTH]
    margin = top[0][1] - top[min(MARGIN_RANK, len(top)) - 1][1]
    found: set[str] = set()
    for chunk, _ in top[:OVERLAP_DOCUMENTS]:
        found |= stems_of(f"{chunk.title} {chunk.content}")
    total = sum(idf.get(s, 0.0) for s in query_stems)
    overlap = sum(idf.get(s, 0.0) for s in query_stems & found) / total if total > 0 else 0.0
    keyword_top = set(keyword_documents[:EVALUATOR_DEPTH])
    documents = [chunk.document_id for chunk, _ in top]
    return {
        "margin": margin,
        "query_overlap": overlap,
        "keyword_agreement": len(keyword_top.intersection(documents)) / len(documents),
        "top1_in_keyword": 1.0 if documents[0] in keyword_top else 0.0,
    }


# --- Query corrections ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WeightedQuery:
    """A keyword query with integer term weights (a weight is a repeat count of the term's phrase)."""

    weights: dict[str, int]

    @property
    def text(self) -> str:
        """The terms, heaviest first."""
        return " ".join(sorted(self.weights, key=lambda t: -self.weights[t]))

    def keyword_query(self) -> KeywordQuery:
        """The keyword search: a term of weight 2 counts twice in BM25."""
        return KeywordQuery(dict(self.weights))


def keyword_reformulation(query: str, document_frequency: dict[str, int], chunk_count: int) -> WeightedQuery:
    """A keyword-focused form of the query: its content terms, generic ones dropped, the rarest doubled.

    Terms found in more than GENERIC_TERM_SHARE of the chunks (and more than GENERIC_TERM_MIN_CHUNKS)
    carry little evidence and are dropped (unless nothing would be left); each remaining term weighs 1
    or 2 by its IDF relative to the rarest.
    """
    terms = query_terms(query)
    specific = [
        t
        for t in terms
        if not is_generic(document_frequency.get(stem(t), 0), chunk_count, GENERIC_TERM_SHARE)
    ]
    kept = specific or terms
    if not kept:
        return WeightedQuery({})
    idfs = {t: bm25_idf(document_frequency.get(stem(t), 0), chunk_count) for t in kept}
    best = max(idfs.values())
    return WeightedQuery({t: max(1, round(2 * idfs[t] / best)) for t in kept})


def is_generic(document_frequency: int, chunk_count: int, share: float) -> bool:
    """Whether a term is in more than `share` of the chunks (and in more than GENERIC_TERM_MIN_CHUNKS)."""
    return document_frequency > max(share * chunk_count, GENERIC_TERM_MIN_CHUNKS)


def bm25_idf(document_frequency: int, total: int) -> float:
    """BM25's IDF (never negative)."""
    return math.log(1 + (total - document_frequency + 0.5) / (document_frequency + 0.5))


_WORD = re.compile(r"\w+", re.UNICODE)


def rm3_expansion(
    query: str,
    feedback: list[tuple[StoredChunk, float]],
    document_frequency: dict[str, int],
    chunk_count: int,
) -> tuple[WeightedQuery, dict[str, float]]:
    """RM3: P(t|R) from the feedback documents weighted by score, interpolated with the original query.

    P(t|R) = sum_d w_d * tf(t, d) / |d| over the feedback documents (w_d their scores, normalized to sum
    1; terms are Porter stems; stopwords, numbers and terms in more than FEEDBACK_TERM_SHARE of the
    chunks, and more than GENERIC_TERM_MIN_CHUNKS, are left out). The FEEDBACK_TERMS strongest terms
    are kept and renormalized; the final weight of a term is
    ORIGINAL_QUERY_WEIGHT * P(t|Q) + (1 - ORIGINAL_QUERY_WEIGHT) * P(t|R), P(t|Q) uniform over the
    query's terms. Returns the query as integer weights (1..MAX_TERM_REPEAT) and the exact weights.
    """
    surface: dict[str, str] = {}
    original: dict[str, None] = {}
    for term in query_terms(query):
        original.setdefault(stem(term), None)
        surface.setdefault(stem(term), term)
    relevance: dict[str, float] = {}
    total_score = sum(max(score, 0.0) for _, score in feedback)
    for chunk, score in feedback:
        weight = max(score, 0.0) / total_score if total_score > 0 else 1.0 / len(feedback)
        words = [
            w
            for w in _WORD.findall(f"{chunk.title} {chunk.content}".lower())
            if w not in STOPWORDS and len(w) > 2 and not w.isdigit()
        ]
        stems = [stem(w) for w in words]
        for word, word_stem in zip(words, stems, strict=True):
            surface.setdefault(word_stem, word)
        length = len(stems) or 1
        for word_stem, count in Counter(stems).items():
            if not is_generic(document_frequency.get(word_stem, 0), chunk_count, FEEDBACK_TERM_SHARE):
                relevance[word_stem] = relevance.get(word_stem, 0.0) + weight * count / length
    strongest = sorted(relevance.items(), key=lambda item: (-item[1], item[0]))[:FEEDBACK_TERMS]
    norm = sum(value for _, value in strongest) or 1.0
    weights: dict[str, float] = {}
    for word_stem in original:
        weights[word_stem] = weights.get(word_stem, 0.0) + ORIGINAL_QUERY_WEIGHT / len(original)
    for word_stem, value in strongest:
        weights[word_stem] = weights.get(word_stem, 0.0) + (1 - ORIGINAL_QUERY_WEIGHT) * value / norm
    if not weights:
        return WeightedQuery({}), {}
    heaviest = max(weights.values())
    ordered = sorted(weights.items(), key=lambda item: (-item[1], item[0]))
    exact = {surface[s]: round(w, 6) for s, w in ordered}
    repeats = {surface[s]: max(1, round(MAX_TERM_REPEAT * w / heaviest)) for s, w in ordered}
    return WeightedQuery(repeats), exact


# --- Fusion of legs -------------------------------------------------------------------------------------
@dataclass
class Leg:
    """One ranking to fuse: cosine legs are min-max scaled over the candidates, BM25 legs divided by the best.

    A cosine leg keeps the vector it searched with, so a web result can be scored by it too.
    """

    name: str
    weight: float
    kind: Literal["cosine", "bm25", "strips"]
    ranking: list[str]
    scores: dict[str, float]
    vector: Vector | None = None


@dataclass
class Candidate:
    """A chunk (or web result) that a leg proposed, with its fused score and per-leg breakdown."""

    chunk: StoredChunk
    cosine: float
    fused: float = 0.0
    best_strip: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


def fuse_legs(legs: list[Leg], candidates: dict[str, Candidate]) -> list[Candidate]:
    """Weighted sum of scaled leg scores over every candidate (retrieval.fusion), best first (ties by id)."""
    totals, norms = weighted_sum(
        [WeightedLeg(leg.weight, leg.scores, natural_zero=leg.kind == "bm25") for leg in legs], candidates
    )
    for leg, leg_norms in zip(legs, norms, strict=True):
        if not leg_norms:
            continue  # a leg that scored no candidate leaves no trace in the breakdown
        ranks = {chunk_id: rank for rank, chunk_id in enumerate(leg.ranking, start=1)}
        for chunk_id, candidate in candidates.items():
            candidate.details[f"{leg.name}_rank"] = ranks.get(chunk_id)
            candidate.details[f"{leg.name}_norm"] = round(leg_norms.get(chunk_id, 0.0), 6)
    for chunk_id, candidate in candidates.items():
        candidate.fused = totals[chunk_id]
        candidate.details["fused_score"] = round(candidate.fused, 6)
    return sorted(candidates.values(), key=lambda c: (-c.fused, c.chunk.chunk_id))


# --- The pipeline ---------------------------------------------------------------------------------------
@dataclass
class FirstPass:
    """The first retrieval and what the evaluator made of it."""

    vector: Vector
    dense: list[ScoredChunk]
    chunks: list[StoredChunk]
    keyword_hits: list[ScoredChunk]
    keyword_documents: list[str]
    query_stems: set[str]
    assessment: Assessment


@dataclass
class Correction:
    """What a correction strategy produced: legs to fuse, their candidates, its report, the web query."""

    legs: list[Leg]
    candidates: dict[str, Candidate]
    report: dict[str, Any]
    search_query: str


class CragPipeline(Pipeline):
    """First pass, calibrated evaluator, three verdicts, and a correction when confidence is low."""

    technique = "crag"
    params_model = CragParams

    def __init__(self, context: PipelineContext) -> None:
        super().__init__(context)
        self._llm = TechniqueLLM(context.settings)
        # The keyword index's vocabulary, for IDF (a read within 1 % of the collection's size will do).
        self._vocabularies = Vocabularies(context.store)

    def retrieve(
        self, query: str, collection: CollectionInfo, options: QueryOptions, params: CragParams
    ) -> Retrieval:
        """Judge the first pass; keep it when correct, otherwise correct it and report every step."""
        web = resolve_search_provider(params.web_search_provider) if params.enable_web_search else None
        metadata_filter = parse_filters(options.filters)
        pool = max(options.top_k, CANDIDATE_POOL)
        first = self.first_pass(query, collection, metadata_filter, pool)
        check_cancelled()
        verdict = self.verdict(first.assessment.confidence, params)
        specific: dict[str, Any] = {
            "evaluator": {"features": first.assessment.report(), "model": EVALUATOR_MODEL},
            "initial_confidence": round(first.assessment.confidence, 6),
            "verdict": verdict,
            "confidence_threshold": params.confidence_threshold,
            "incorrect_threshold": params.effective_incorrect_threshold,
            "correction_strategy": params.correction_strategy,
            "first_pass_candidates": len(first.dense),
        }
        searched = self.context.store.chunk_count(collection.id)
        if verdict == "correct":
            documents = [
                RetrievedDocument(chunk, hit.score)
                for chunk, hit in zip(first.chunks[: options.top_k], first.dense, strict=False)
            ]
            specific |= {
                "action": "none",
                "final_confidence": round(first.assessment.confidence, 6),
                "web_search": {"enabled": params.enable_web_search, "called": False},
            }
            return Retrieval(documents, searched, specific)

        documents, report = self.correct(query, collection, options, params, first, verdict, web)
        specific |= report
        return Retrieval(documents, searched, specific)

    def correct(
        self,
        query: str,
        collection: CollectionInfo,
        options: QueryOptions,
        params: CragParams,
        first: FirstPass,
        verdict: Verdict,
        web: tuple[str, WebSearchProvider] | None = None,
    ) -> tuple[list[RetrievedDocument], dict[str, Any]]:
        """Correct an ambiguous or incorrect first pass: strategy, web results, fusion, final confidence."""
        metadata_filter = parse_filters(options.filters)
        pool = max(options.top_k, CANDIDATE_POOL)
        if params.correction_strategy == "filter":
            correction = self._refine(query, options, params, first, verdict)
        elif params.correction_strategy == "expand":
            correction = self._expand(query, collection, first, verdict, metadata_filter, pool)
        else:
            correction = self._rewrite(query, collection, first, verdict, metadata_filter, pool)
        report: dict[str, Any] = {"action": params.correction_strategy, **correction.report}
        check_cancelled()
        report["web_search"] = self._web_search(web, correction, first, options, params)
        fused = fuse_legs(correction.legs, correction.candidates)
        documents = [RetrievedDocument(c.chunk, c.cosine, c.details) for c in fused[: options.top_k]]
        final = self.assess(collection, first, [(d.chunk, d.score) for d in documents])
        report |= {
            "leg_weights": {leg.name: leg.weight for leg in correction.legs},
            "second_pass_candidates": len(correction.candidates),
            "final_confidence": round(final.confidence, 6),
            "final_evaluator_features": final.report(),
        }
        return documents, report

    @staticmethod
    def verdict(confidence: float, params: CragParams) -> Verdict:
        """Correct at or above confidence_threshold, incorrect below incorrect_threshold, else ambiguous."""
        if confidence >= params.confidence_threshold:
            return "correct"
        if confidence < params.effective_incorrect_threshold:
            return "incorrect"
        return "ambiguous"

    # First pass and evaluator
    def first_pass(
        self, query: str, collection: CollectionInfo, metadata_filter: MetadataFilter | None, pool: int
    ) -> FirstPass:
        """Dense search (the results on a correct verdict), a BM25 second opinion, and the evaluator."""
        store = self.context.store
        vector = self.context.embedder.encode_query(query)
        dense = store.vector_search(collection.id, vector, pool, metadata_filter)
        terms = query_terms(query)
        keyword_query = KeywordQuery.of(terms)
        keyword_hits = (
            keyword_query.with_evidence(
                store.keyword_search(collection.id, keyword_query, pool, metadata_filter)
            )
            if terms
            else []
        )
        by_id = {c.chunk_id: c for c in store.get_chunks(collection.id, [h.chunk_id for h in dense])}
        dense = [hit for hit in dense if hit.chunk_id in by_id]
        keyword_chunks = store.get_chunks(collection.id, [hit.chunk_id for hit in keyword_hits])
        first = FirstPass(
            vector,
            dense,
            [by_id[hit.chunk_id] for hit in dense],
            keyword_hits,
            list(dict.fromkeys(chunk.document_id for chunk in keyword_chunks)),
            stems_of(query),
            Assessment({}, 0.0),
        )
        first.assessment = self.assess(
            collection, first, [(c, h.score) for c, h in zip(first.chunks, dense, strict=True)]
        )
        return first

    def assess(
        self, collection: CollectionInfo, first: FirstPass, ranking: list[tuple[StoredChunk, float]]
    ) -> Assessment:
        """The evaluator over a ranking (chunks best first, with their cosine to the original query)."""
        frequency, total = self._vocabularies.get(collection), max(collection.chunk_count, 1)
        idf = {s: bm25_idf(frequency.get(s, 0), total) for s in first.query_stems}
        seen: set[str] = set()
        documents = []
        for chunk, score in ranking:
            if chunk.document_id not in seen:
                seen.add(chunk.document_id)
                documents.append((chunk, score))
        features = evaluator_features(first.query_stems, documents, first.keyword_documents, idf)
        return Assessment(features, calibrated_confidence(features))

    # Corrections
    def _rewrite(
        self,
        query: str,
        collection: CollectionInfo,
        first: FirstPass,
        verdict: Verdict,
        metadata_filter: MetadataFilter | None,
        pool: int,
    ) -> Correction:
        """The LLM's rewrite (dense and keyword legs), or the keyword reformulation (keyword leg only)."""
        frequency, total = self._vocabularies.get(collection), max(collection.chunk_count, 1)
        produced: Produced = self._llm.produce(
            REWRITE_PROMPT,
            f"Query: {query}",
            max_tokens=REWRITE_MAX_TOKENS,
            fallback_name="keywords",
            fallback=lambda: keyword_reformulation(query, frequency, total).text,
            clean=lambda text: first_line(text)[:2048],
        )
        keywords = keyword_reformulation(produced.text, frequency, total)
        # A natural-language rewrite gets its own dense leg. MiniLM embeds a bare keyword list worse than
        # the sentence it came from (SciFact train nDCG@10 0.635 vs 0.679), so the keyword reformulation
        # feeds the keyword leg only and the dense leg keeps the query.
        corrected = (
            self.context.embedder.encode_query(produced.text) if produced.source == "llm" else first.vector
        )
        legs, candidates = self._search_legs(
            collection, first, verdict, metadata_filter, pool, corrected, keywords
        )
        report = {
            "rewritten_query": produced.text,
            "rewrite_source": produced.source,
            **({"llm_error": produced.error} if produced.error else {}),
            "keyword_query": keywords.weights,
        }
        return Correction(legs, candidates, report, produced.text)

    def _expand(
        self,
        query: str,
        collection: CollectionInfo,
        first: FirstPass,
        verdict: Verdict,
        metadata_filter: MetadataFilter | None,
        pool: int,
    ) -> Correction:
        """RM3 pseudo-relevance feedback from the top documents of the first pass (dense and BM25 fused)."""
        frequency, total = self._vocabularies.get(collection), max(collection.chunk_count, 1)
        # Feedback documents: the first pass's dense and BM25 rankings fused (SciFact train: feedback from
        # the dense ranking alone drifts on exactly the queries the evaluator doubts).
        candidates = self._candidates(collection, first.vector, first.dense, first.keyword_hits)
        feedback_legs = [
            Leg("dense", 0.5, "cosine", [h.chunk_id for h in first.dense], _cosines(candidates)),
            Leg(
                "keyword", 0.5, "bm25", [h.chunk_id for h in first.keyword_hits], _scores(first.keyword_hits)
            ),
        ]
        feedback: list[tuple[StoredChunk, float]] = []
        seen: set[str] = set()
        for candidate in fuse_legs(feedback_legs, candidates):
            if len(feedback) < FEEDBACK_DOCUMENTS and candidate.chunk.document_id not in seen:
                seen.add(candidate.chunk.document_id)
                feedback.append((candidate.chunk, candidate.fused))
        expanded, exact = rm3_expansion(query, feedback, frequency, total)
        original = set(query_terms(query))
        legs, fused = self._search_legs(
            collection, first, verdict, metadata_filter, pool, first.vector, expanded
        )
        report = {
            "expanded_query": exact,
            "expansion_terms": [t for t in exact if t not in original],
            "feedback_documents": [chunk.document_id for chunk, _ in feedback],
            "keyword_query": expanded.weights,
        }
        return Correction(legs, fused, report, query)

    def _search_legs(
        self,
        collection: CollectionInfo,
        first: FirstPass,
        verdict: Verdict,
        metadata_filter: MetadataFilter | None,
        pool: int,
        corrected_vector: Vector,
        keywords: WeightedQuery,
    ) -> tuple[list[Leg], dict[str, Candidate]]:
        """The second pass: the corrected query's dense and keyword legs, the first pass by the verdict."""
        store = self.context.store
        weights = LEG_WEIGHTS[verdict]
        keyword_query = keywords.keyword_query()
        keyword_hits = (
            keyword_query.with_evidence(
                store.keyword_search(collection.id, keyword_query, pool, metadata_filter)
            )
            if keywords.weights
            else []
        )
        dense_legs: list[tuple[str, float, list[ScoredChunk], Vector]] = []
        if corrected_vector is first.vector:
            # One dense ranking serves as first pass and corrected dense leg: their weights add up.
            dense_weight = weights["first_pass"] + weights["corrected_dense"]
            dense_legs.append(("dense", dense_weight, first.dense, first.vector))
        else:
            corrected = store.vector_search(collection.id, corrected_vector, pool, metadata_filter)
            dense_legs.append(("first_pass", weights["first_pass"], first.dense, first.vector))
            dense_legs.append(("corrected_dense", weights["corrected_dense"], corrected, corrected_vector))
        dense_legs = [leg for leg in dense_legs if leg[1] > 0]
        candidates = self._candidates(collection, first.vector, keyword_hits, *(leg[2] for leg in dense_legs))
        legs = [
            Leg(
                name,
                weight,
                "cosine",
                [h.chunk_id for h in hits],
                _cosines(candidates)
                if vector is first.vector
                else store.vector_scores(collection.id, vector, list(candidates)),
                vector,
            )
            for name, weight, hits, vector in dense_legs
        ]
        legs.append(
            Leg(
                "corrected_keyword",
                weights["corrected_keyword"],
                "bm25",
                [h.chunk_id for h in keyword_hits],
                _scores(keyword_hits),
            )
        )
        return legs, candidates

    def _candidates(
        self, collection: CollectionInfo, vector: Vector, *rankings: list[ScoredChunk]
    ) -> dict[str, Candidate]:
        """Every chunk any ranking proposed, with its exact cosine to the original query."""
        store = self.context.store
        ids = list(dict.fromkeys(hit.chunk_id for ranking in rankings for hit in ranking))
        cosines = store.vector_scores(collection.id, vector, ids)
        return {
            c.chunk_id: Candidate(c, cosines.get(c.chunk_id, 0.0))
            for c in store.get_chunks(collection.id, ids)
        }

    def _refine(
        self, query: str, options: QueryOptions, params: CragParams, first: FirstPass, verdict: Verdict
    ) -> Correction:
        """Knowledge refinement: the retrieved chunks cut to their sentence strips that match the query.

        Ambiguous keeps the first-pass order as half of the evidence, next to each chunk's best kept strip;
        incorrect ranks by the best kept strip alone. A chunk with no strip at strip_threshold is dropped.
        """
        candidates = {
            chunk.chunk_id: Candidate(chunk, hit.score)
            for chunk, hit in zip(first.chunks[: options.top_k], first.dense, strict=False)
        }
        refined = len(candidates)
        kept, total = self._keep_strips(first.vector, candidates, params.strip_threshold)
        weights = STRIP_LEG_WEIGHTS[verdict]
        best = {c: x.best_strip for c, x in candidates.items() if x.best_strip is not None}
        legs = [
            Leg("strips", weights["strips"], "strips", sorted(best, key=lambda c: -best[c]), best),
        ]
        if weights["first_pass"] > 0:
            first_ranking = [h.chunk_id for h in first.dense if h.chunk_id in candidates]
            legs.insert(
                0,
                Leg(
                    "first_pass",
                    weights["first_pass"],
                    "cosine",
                    first_ranking,
                    _cosines(candidates),
                    first.vector,
                ),
            )
        report = {
            "strips_total": total,
            "strips_kept": kept,
            "chunks_refined": refined,
            "chunks_dropped": refined - len(candidates),
            "strip_threshold": params.strip_threshold,
        }
        return Correction(legs, candidates, report, query)

    def _keep_strips(
        self, vector: Vector, candidates: dict[str, Candidate], threshold: float
    ) -> tuple[int, int]:
        """Cut each candidate to its sentence strips whose cosine to the query reaches the threshold.

        A candidate's content becomes its kept strips (in order); one with none is removed. Returns the
        numbers of strips kept and seen.
        """
        strips = {c: [s.text for s in split_sentences(x.chunk.content)] for c, x in candidates.items()}
        unique = list(dict.fromkeys(text for texts in strips.values() for text in texts))
        relevance: dict[str, float] = {}
        if unique:
            check_cancelled()
            scores = self.context.embedder.encode(unique) @ vector
            relevance = dict(zip(unique, (float(s) for s in scores), strict=True))
        kept_total = total = 0
        for chunk_id, texts in strips.items():
            kept = [text for text in texts if relevance[text] >= threshold]
            total += len(texts)
            kept_total += len(kept)
            if not kept:
                del candidates[chunk_id]
                continue
            candidate = candidates[chunk_id]
            candidate.chunk = replace(candidate.chunk, content=" ".join(kept))
            candidate.best_strip = max(relevance[text] for text in kept)
            candidate.details |= {"strips_kept": len(kept), "strips_total": len(texts)}
        return kept_total, total

    # Web search
    def _web_search(
        self,
        web: tuple[str, WebSearchProvider] | None,
        correction: Correction,
        first: FirstPass,
        options: QueryOptions,
        params: CragParams,
    ) -> dict[str, Any]:
        """Ask the provider and add its results as candidates, scored by every leg that can score them.

        A web result has no BM25 score (it is not in the full-text index); cosine legs score its text
        with their own query vector, and with the filter strategy it is cut into strips like a chunk.
        """
        if web is None:
            return {"enabled": False, "called": False}
        name, provider = web
        report: dict[str, Any] = {"enabled": True, "provider": name, "called": False}
        if options.filters:
            report["skipped"] = "options.filters restricts the results to documents of the collection"
            return report
        wanted = min(options.top_k, WEB_RESULTS_MAX)
        results = provider.search(correction.search_query, wanted)[:wanted]
        report |= {"called": True, "query": correction.search_query, "results": len(results)}
        chunks = [
            StoredChunk(
                chunk_id=f"web:{name}:{rank}",
                document_id=result.url,
                index=0,
                content=result.content,
                start_char=0,
                end_char=len(result.content),
                title=result.title,
                metadata={"source": result.url, "origin": "web", "provider": name},
            )
            for rank, result in enumerate(results, start=1)
            if result.content.strip()
        ]
        if not chunks:
            return report
        encoded = self.context.embedder.encode([embedding_text(c.title, c.content) for c in chunks])
        vectors = {c.chunk_id: v for c, v in zip(chunks, encoded, strict=True)}
        candidates = {
            c.chunk_id: Candidate(c, float(vectors[c.chunk_id] @ first.vector), details={"origin": "web"})
            for c in chunks
        }
        if params.correction_strategy == "filter":
            self._keep_strips(first.vector, candidates, params.strip_threshold)
        for leg in correction.legs:
            for chunk_id, candidate in candidates.items():
                if leg.kind == "strips" and candidate.best_strip is not None:
                    leg.scores[chunk_id] = candidate.best_strip
                elif leg.vector is not None:
                    leg.scores[chunk_id] = float(vectors[chunk_id] @ leg.vector)
        correction.candidates.update(candidates)
        report["added"] = len(candidates)
        return report


def _cosines(candidates: dict[str, Candidate]) -> dict[str, float]:
    return {chunk_id: candidate.cosine for chunk_id, candidate in candidates.items()}


def _scores(hits: list[ScoredChunk]) -> dict[str, float]:
    return {hit.chunk_id: hit.score for hit in hits}

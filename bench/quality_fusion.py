"""Offline fusion experiments for rag_hybrid_ifind on a BEIR split: collect each leg once, fuse many ways.

    RAG_DATA_DIR=data .venv/bin/python -m bench.quality_fusion collect --dataset ../shared/data/scifact \
        --split train --out /tmp/quality_train.pkl
    .venv/bin/python -m bench.quality_fusion score /tmp/quality_train.pkl \
        --baseline "today (chunk, minmax+bm25/best, .5/.5)" --json bench/results/quality/x.json

    .venv/bin/python -m bench.quality_fusion calibrate /tmp/quality_train.pkl [--test /tmp/quality_test.pkl]
    RAG_DATA_DIR=data .venv/bin/python -m bench.quality_fusion latency --variant none='{}' \
        --variant colbert='{"rerank": "colbert"}' --json bench/results/quality/x.json

`collect` runs the legs the way the technique does (the store's exact cosine top `--pool` chunks, its
flat BM25 top `--pool`, the exact cosine of every keyword-only candidate) and, for comparison, legs that
the technique does not run today: ColBERT's MaxSim over the union (the colbert pipeline's own token
selection and threshold), a second BM25 query expanded by RM3 pseudo-relevance feedback (the store's
keyword search with term weights; `--no-rm3` skips it), a Rocchio-expanded dense query and the store's
multifield BM25 top `--pool`. It pickles every candidate's
scores. `score` fuses them into document rankings under each variant and scores them with the harness's
pytrec_eval measures (nDCG@10, Recall@100); with --baseline, each variant's mean per-query nDCG@10
difference from it, its standard error and how many queries went up and down. `calibrate` fits a
logistic regression on each first-pass candidate's leg scores (label: its document is relevant),
cross-validated by query on the collected split (5 folds) and, with --test, fitted on all of it and scored
on the other split. `latency` times rag_hybrid_ifind's call under each technique_params variant,
alternating per query, each call encoding its query afresh (wall clock and the process's CPU time). The
collection must exist
(build it with `iris-rag eval`). `--pool` 100 is what a client's call uses (`candidate_pool`); `iris-rag
eval` asks for 300 chunks per query, which raises the technique's pool to 300, so its hybrid figure differs
from the `today` variant here by a few thousandths.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.evaluation.beir import BeirDataset, load_beir
from iris_rag.evaluation.metrics import score_queries, score_run
from iris_rag.retrieval.fusion import min_max
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import KeywordQuery
from iris_rag.text import STOPWORDS, query_terms, stem

Floats = npt.NDArray[np.float32]


@dataclass
class QueryLegs:
    """One query's candidates: every leg's score by chunk id (a leg that did not return it: absent)."""

    dense: dict[str, float]  # exact cosine of every candidate of any leg
    dense_top: list[str]  # the dense leg's top pool, best first
    keyword: dict[str, float]  # flat BM25 top pool
    rm3: dict[str, float] = field(default_factory=dict)  # BM25 of the RM3-expanded query, top pool
    rocchio: dict[str, float] = field(default_factory=dict)  # cosine with the Rocchio query, top pool
    rm3_fused: dict[str, float] = field(default_factory=dict)  # RM3 fed by the fused first pass
    rocchio_fused: dict[str, float] = field(default_factory=dict)  # Rocchio fed by the fused first pass
    colbert: dict[str, float] = field(default_factory=dict)  # MaxSim / query tokens, every candidate
    multifield: dict[str, float] = field(default_factory=dict)  # multifield BM25 top pool

    @property
    def dense_top_set(self) -> set[str]:
        """The dense leg's own candidates."""
        return set(self.dense_top)


@dataclass
class Collected:
    """Every query's legs and the chunk → document map."""

    split: str
    pool: int
    queries: dict[str, QueryLegs]
    document_of: dict[str, str]


# ---- pseudo-relevance feedback (measured here; not in the technique: see docs/benchmarks.md) -------------
# RM3 (Abdul-Jaleel et al. 2004) with Anserini's defaults; Rocchio on the dense vector (Rocchio 1971; for
# dense retrievers, Li et al. 2022). Fixed, published parameters: nothing here was tuned on SciFact.
# Commit cce059d ran both inside rag_hybrid_ifind (technique_params.query_expansion) for the eval figures.


def _terms(text: str) -> list[str]:
    """Every lowercase term of a text, stopwords removed, repeats kept (the keyword index's terms)."""
    return [t for t in re.findall(r"\w+", text.lower()) if t not in STOPWORDS]


RM3_FEEDBACK_CHUNKS = 10
"""RM3: the first pass's best chunks the expansion terms come from (Anserini's fbDocs)."""
RM3_TERMS = 10
"""RM3: how many expansion terms are added (Anserini's fbTerms)."""
RM3_ORIGINAL_WEIGHT = 0.5
"""RM3: the original query's share of the expanded query (Anserini's originalQueryWeight)."""
RM3_MAX_DOCUMENT_FREQUENCY = 0.1
"""RM3: terms in more than this share of the chunks say too little to be added."""
RM3_SCALE = 10
"""The expanded query's weights become whole repeats (KeywordQuery): the heaviest term counts this often."""


def rm3_expansion(
    terms: Sequence[str],
    feedback: Sequence[tuple[str, float]],
    vocabulary: Mapping[str, int],
    chunk_count: int,
) -> dict[str, int]:
    """RM3 (Lavrenko and Croft's relevance model 1, interpolated with the query; Abdul-Jaleel et al. 2004).

    `feedback` holds the first pass's best chunks (text, BM25 score). A term's weight in the relevance
    model is the sum over them of P(term | chunk) x P(chunk | query), where P(term | chunk) is its share of
    the chunk's terms and P(chunk | query) the chunk's score over the feedback's total. The RM3_TERMS
    heaviest stems (digits, one-letter terms and terms in more than a tenth of the chunks left out) share
    1 - RM3_ORIGINAL_WEIGHT; the query's own terms share RM3_ORIGINAL_WEIGHT equally. The result is a
    KeywordQuery's terms: each weight scaled so the heaviest is RM3_SCALE, rounded, at least 1. A query
    term keeps its own spelling (the index stems it); an added term is the indexed stem. Without
    feedback the query comes back unchanged, each term once.
    """
    total = sum(score for _, score in feedback)
    if not terms or total <= 0:
        return dict.fromkeys(terms, 1)
    limit = RM3_MAX_DOCUMENT_FREQUENCY * chunk_count
    model: dict[str, float] = {}
    for text, score in feedback:
        stems = [stem(t) for t in _terms(text) if len(t) > 1 and not t.isdigit()]
        for term, count in Counter(stems).items():
            if vocabulary.get(term, 0) <= limit:
                model[term] = model.get(term, 0.0) + count / len(stems) * score / total
    expansion = sorted(model.items(), key=lambda item: (-item[1], item[0]))[:RM3_TERMS]
    mass = sum(weight for _, weight in expansion)
    spelled = {stem(term): term for term in terms}
    weights = dict.fromkeys(terms, RM3_ORIGINAL_WEIGHT / len(terms))
    for term, weight in expansion:
        key = spelled.get(term, term)
        weights[key] = weights.get(key, 0.0) + (1 - RM3_ORIGINAL_WEIGHT) * weight / mass
    heaviest = max(weights.values())
    return {term: max(1, round(RM3_SCALE * weight / heaviest)) for term, weight in weights.items()}


ROCCHIO_FEEDBACK_CHUNKS = 3
"""Rocchio: the first pass's best chunks whose vectors move the query (Li et al.'s k = 3)."""
ROCCHIO_BETA = 0.5
"""Rocchio: the weight of the feedback chunks' mean vector (the query's is 1)."""


def rocchio_vector(
    query: npt.NDArray[np.float32], feedback: Sequence[npt.NDArray[np.float32]]
) -> npt.NDArray[np.float32]:
    """Rocchio without negatives: query + ROCCHIO_BETA x the feedback vectors' mean, unit length.

    Without feedback the query comes back unchanged.
    """
    if not feedback:
        return query
    moved = query.astype(np.float64) + ROCCHIO_BETA * np.mean(np.stack(feedback), axis=0)
    norm = float(np.linalg.norm(moved))
    result: npt.NDArray[np.float32] = (moved / norm if norm > 0 else moved).astype(np.float32)
    return result


def collect(
    service: RagService,
    dataset: BeirDataset,
    collection_id: str,
    pool: int,
    *,
    colbert: bool,
    rm3: bool = True,
    colbert_params: dict[str, float] | None = None,
) -> Collected:
    """Every leg of every query, as the store and the pipelines compute them."""
    store = service.store
    collection = store.get_collection(collection_id)
    if collection is None:
        sys.exit(f"no collection {collection_id!r}: build it with iris-rag eval first")
    service.embedder.wait_ready()
    vocabulary = store.term_document_counts(collection_id)
    total_chunks = store.chunk_count(collection_id)
    document_of: dict[str, str] = {}
    texts: dict[str, str] = {}
    colbert_pipeline: Any = service.pipelines.get("colbert") if colbert else None
    idf = colbert_pipeline._collection_idf(collection) if colbert_pipeline else None
    results: dict[str, QueryLegs] = {}
    started = time.perf_counter()

    def remember(chunk_ids: list[str]) -> None:
        unknown = [c for c in chunk_ids if c not in document_of]
        for chunk in store.get_chunks(collection_id, unknown):
            document_of[chunk.chunk_id] = chunk.document_id
            texts[chunk.chunk_id] = f"{chunk.title} {chunk.content}"

    for number, (query_id, query) in enumerate(dataset.queries.items(), start=1):
        vector = service.embedder.encode_query(query)
        terms = query_terms(query)
        dense_hits = store.vector_search(collection_id, vector, pool)
        keyword_hits = store.keyword_search(collection_id, KeywordQuery.of(terms), pool) if terms else []
        legs = QueryLegs(
            dense={h.chunk_id: h.score for h in dense_hits},
            dense_top=[h.chunk_id for h in dense_hits],
            keyword={h.chunk_id: h.score for h in keyword_hits},
        )
        if terms:
            multifield = KeywordQuery.of(terms, scoring="multifield")
            legs.multifield = {
                h.chunk_id: h.score for h in store.keyword_search(collection_id, multifield, pool)
            }
        remember([h.chunk_id for h in keyword_hits[:RM3_FEEDBACK_CHUNKS]])
        if keyword_hits and rm3:
            feedback = [(texts[h.chunk_id], h.score) for h in keyword_hits[:RM3_FEEDBACK_CHUNKS]]
            expanded = KeywordQuery(rm3_expansion(terms, feedback, vocabulary, total_chunks))
            legs.rm3 = {h.chunk_id: h.score for h in store.keyword_search(collection_id, expanded, pool)}
        top_vectors = store.chunk_vectors(collection_id, legs.dense_top[:ROCCHIO_FEEDBACK_CHUNKS])
        if top_vectors:
            moved = rocchio_vector(vector, list(top_vectors.values()))
            legs.rocchio = {h.chunk_id: h.score for h in store.vector_search(collection_id, moved, pool)}
        first = set(legs.dense_top) | legs.keyword.keys()
        missing = [c for c in first if c not in legs.dense]
        legs.dense.update(store.vector_scores(collection_id, vector, missing))
        today = fused(
            [(0.5, _restrict(legs.dense, first), "minmax"), (0.5, legs.keyword, "bm25")],
            {},
            document_level=False,
        )
        best = ranked(today)[:RM3_FEEDBACK_CHUNKS]
        remember(best)
        if terms and rm3:
            feedback = [(texts[c], today[c]) for c in best]
            expanded = KeywordQuery(rm3_expansion(terms, feedback, vocabulary, total_chunks))
            legs.rm3_fused = {
                h.chunk_id: h.score for h in store.keyword_search(collection_id, expanded, pool)
            }
        top_vectors = store.chunk_vectors(collection_id, best[:ROCCHIO_FEEDBACK_CHUNKS])
        if top_vectors:
            moved = rocchio_vector(vector, [top_vectors[c] for c in best[:ROCCHIO_FEEDBACK_CHUNKS]])
            legs.rocchio_fused = {
                h.chunk_id: h.score for h in store.vector_search(collection_id, moved, pool)
            }
            # As the technique would: the moved query's exact cosine for every keyword candidate too.
            others = [c for c in legs.keyword if c not in legs.rocchio_fused]
            legs.rocchio_fused.update(store.vector_scores(collection_id, moved, others))
        candidates = list(
            first
            | legs.rm3.keys()
            | legs.rocchio.keys()
            | legs.rm3_fused.keys()
            | legs.rocchio_fused.keys()
            | legs.multifield.keys()
        )
        missing = [c for c in candidates if c not in legs.dense]
        legs.dense.update(store.vector_scores(collection_id, vector, missing))
        remember(candidates)
        if colbert_pipeline is not None:
            legs.colbert = _colbert_scores(
                colbert_pipeline, collection, query, candidates, idf, colbert_params or {}
            )
        results[query_id] = legs
        if number % 100 == 0:
            rate = number / (time.perf_counter() - started)
            print(f"collect: {number}/{len(dataset.queries)} queries, {rate:.1f}/s", file=sys.stderr)
    return Collected(dataset.split, pool, results, document_of)


def _colbert_scores(
    pipeline: Any, collection: Any, query: str, chunk_ids: list[str], idf: Any, overrides: dict[str, float]
) -> dict[str, float]:
    """The colbert pipeline's normalized interaction (MaxSim / query tokens) of each candidate.

    `overrides`: ColbertParams fields to change (compression_ratio, interaction_threshold); default none.
    """
    from iris_rag.techniques.colbert.pipeline import ColbertParams, _Candidate, _select_tokens, batch_maxsim

    params = ColbertParams(**overrides)
    encoding = pipeline.encoder.encode_query(query, max_length=params.max_query_length).result()
    stored = pipeline.index.load(collection.id, chunk_ids)
    candidates = [_Candidate(c, 0.0, stored.get(c)) for c in chunk_ids]
    for candidate in candidates:
        _select_tokens(candidate, params.compression_ratio, idf)
    rows = encoding.tokens.vectors
    raw = batch_maxsim(rows, [c.vectors for c in candidates], params.interaction_threshold)
    count = max(rows.shape[0], 1)
    return {c.chunk_id: float(s) / count for c, s in zip(candidates, raw, strict=True)}


# ---- fusion variants ---------------------------------------------------------------------------------

Scores = dict[str, float]
Variant = Callable[[QueryLegs, Mapping[str, str]], Scores]


def _bm25_norm(scores: Mapping[str, float]) -> Scores:
    best = max(scores.values(), default=0.0)
    return {k: v / best if best > 0 else 0.0 for k, v in scores.items()}


def _by_document(scores: Mapping[str, float], document_of: Mapping[str, str]) -> Scores:
    """MaxP: each document at its best chunk's score."""
    out: Scores = {}
    for chunk_id, score in scores.items():
        doc = document_of[chunk_id]
        if score > out.get(doc, -math.inf):
            out[doc] = score
    return out


def _restrict(scores: Mapping[str, float], keys: Any) -> Scores:
    return {k: scores[k] for k in keys if k in scores}


def fused(
    legs: list[tuple[float, Scores, str]], document_of: Mapping[str, str], *, document_level: bool
) -> Scores:
    """sum of weight x normalized leg; norm 'bm25' (divide by best), 'minmax', 'z', 'cos' (raw cosine)."""
    if document_level:
        legs = [(w, _by_document(s, document_of), n) for w, s, n in legs]
    total: Scores = {}
    for weight, scores, norm in legs:
        if not scores or weight == 0:
            continue
        if norm == "bm25":
            normed = _bm25_norm(scores)
        elif norm == "minmax":
            normed = min_max(scores)
        elif norm == "z":
            values = np.array(list(scores.values()))
            mean, std = float(values.mean()), float(values.std()) or 1.0
            normed = {k: (v - mean) / std for k, v in scores.items()}
            floor = min(normed.values())
            normed = {k: v - floor for k, v in normed.items()}
        else:
            normed = dict(scores)
        for key, value in normed.items():
            total[key] = total.get(key, 0.0) + weight * value
    return total


def rrf(rankings: list[tuple[float, list[str]]], k: int = 60) -> Scores:
    """Weighted reciprocal rank fusion over ranked id lists."""
    out: Scores = {}
    for weight, ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            out[key] = out.get(key, 0.0) + weight / (k + rank)
    return out


def ranked(scores: Mapping[str, float]) -> list[str]:
    return sorted(scores, key=lambda k: (-scores[k], k))


def documents(
    chunk_scores: Mapping[str, float], document_of: Mapping[str, str], depth: int = 100
) -> list[str]:
    """Chunk ranking → document ranking at the best chunk (the harness's rule)."""
    out: dict[str, None] = {}
    for chunk_id in ranked(chunk_scores):
        out.setdefault(document_of.get(chunk_id, chunk_id), None)
        if len(out) >= depth:
            break
    return list(out)


def variants() -> dict[str, Callable[[QueryLegs, Mapping[str, str]], list[str]]]:
    """Every variant: name → a document ranking for one query."""

    def today(q: QueryLegs, d: Mapping[str, str]) -> list[str]:
        cands = q.dense_top_set | q.keyword.keys()
        dense = _restrict(q.dense, cands)
        return documents(
            fused([(0.5, dense, "minmax"), (0.5, q.keyword, "bm25")], d, document_level=False), d
        )

    def make(
        weights: dict[str, float],
        *,
        doc: bool = False,
        dense_norm: str = "minmax",
        kw: str = "keyword",
        cand_legs: tuple[str, ...] = ("dense", "keyword"),
    ) -> Callable[[QueryLegs, Mapping[str, str]], list[str]]:
        def run(q: QueryLegs, d: Mapping[str, str]) -> list[str]:
            cands: set[str] = set()
            for leg in cand_legs:
                cands |= q.dense_top_set if leg == "dense" else set(getattr(q, leg).keys())
            legs: list[tuple[float, Scores, str]] = []
            for name, weight in weights.items():
                if name == "dense":
                    legs.append((weight, _restrict(q.dense, cands), dense_norm))
                elif name == "colbert":
                    legs.append((weight, _restrict(q.colbert, cands), dense_norm))
                elif name.startswith("rocchio"):
                    legs.append((weight, _restrict(getattr(q, name), cands), dense_norm))
                else:
                    legs.append((weight, _restrict(getattr(q, name), cands), "bm25"))
            scores = fused(legs, d, document_level=doc)
            if doc:
                return ranked(scores)[:100]
            return documents(scores, d)

        return run

    def rrf_variant(
        names: tuple[str, ...], k: int = 60
    ) -> Callable[[QueryLegs, Mapping[str, str]], list[str]]:
        def run(q: QueryLegs, d: Mapping[str, str]) -> list[str]:
            lists = []
            for name in names:
                scores = q.dense if name == "dense" else getattr(q, name)
                if name == "dense":
                    scores = _restrict(q.dense, q.dense_top_set)
                lists.append((1.0, ranked(_by_document(scores, d))))
            return ranked(rrf(lists, k))[:100]

        return run

    def colbert_rerank(
        depth: int, weight: float = 1 / 3
    ) -> Callable[[QueryLegs, Mapping[str, str]], list[str]]:
        """Today's fusion, then its top `depth` chunks re-fused with the ColBERT leg at `weight`.

        The dense and BM25 legs share the rest equally; each leg is scaled over the top `depth` only.
        """

        def run(q: QueryLegs, d: Mapping[str, str]) -> list[str]:
            cands = q.dense_top_set | q.keyword.keys()
            first = fused(
                [(0.5, _restrict(q.dense, cands), "minmax"), (0.5, q.keyword, "bm25")],
                d,
                document_level=False,
            )
            order = ranked(first)
            top = order[:depth]
            legs = [
                ((1 - weight) / 2, _restrict(q.dense, top), "minmax"),
                ((1 - weight) / 2, _restrict(q.keyword, top), "bm25"),
                (weight, _restrict(q.colbert, top), "minmax"),
            ]
            head = fused(legs, d, document_level=False)
            rest = {c: -1.0 - i for i, c in enumerate(order[depth:])}
            return documents({**head, **rest}, d)

        return run

    table: dict[str, Callable[[QueryLegs, Mapping[str, str]], list[str]]] = {
        "colbert rerank of the fused top 20": colbert_rerank(20),
        "colbert rerank of the fused top 30": colbert_rerank(30),
        "colbert rerank of the fused top 50": colbert_rerank(50),
        "today (chunk, minmax+bm25/best, .5/.5)": today,
        "doc-level MaxP, .5/.5": make({"dense": 0.5, "keyword": 0.5}, doc=True),
        "dense alone": make({"dense": 1.0}),
        "keyword alone": make({"keyword": 1.0}, cand_legs=("keyword",)),
        "rm3 alone": make({"rm3": 1.0}, cand_legs=("rm3",)),
        "rocchio alone": make({"rocchio": 1.0}, cand_legs=("rocchio",)),
        "dense + rm3 .5/.5": make({"dense": 0.5, "rm3": 0.5}, cand_legs=("dense", "rm3")),
        "dense + rm3 .5/.5 doc": make({"dense": 0.5, "rm3": 0.5}, doc=True, cand_legs=("dense", "rm3")),
        "rocchio + keyword .5/.5": make({"rocchio": 0.5, "keyword": 0.5}, cand_legs=("rocchio", "keyword")),
        "rm3_fused alone": make({"rm3_fused": 1.0}, cand_legs=("rm3_fused",)),
        "dense + rm3_fused .5/.5": make({"dense": 0.5, "rm3_fused": 0.5}, cand_legs=("dense", "rm3_fused")),
        "rocchio_fused + kw .5/.5": make(
            {"rocchio_fused": 0.5, "keyword": 0.5}, cand_legs=("rocchio_fused", "keyword")
        ),
        "rocchio_fused + rm3_fused .5/.5": make(
            {"rocchio_fused": 0.5, "rm3_fused": 0.5}, cand_legs=("rocchio_fused", "rm3_fused")
        ),
        "rocchio_fused + kw .5/.5 doc": make(
            {"rocchio_fused": 0.5, "keyword": 0.5}, doc=True, cand_legs=("rocchio_fused", "keyword")
        ),
        "dense+kw+rm3 1/3": make(
            {"dense": 1 / 3, "keyword": 1 / 3, "rm3": 1 / 3}, cand_legs=("dense", "keyword", "rm3")
        ),
        "rrf dense,kw": rrf_variant(("dense", "keyword")),
        "rrf dense,kw,colbert": rrf_variant(("dense", "keyword", "colbert")),
        "dense+kw+colbert 1/3": make({"dense": 1 / 3, "keyword": 1 / 3, "colbert": 1 / 3}),
        "dense+kw+colbert 1/3 doc": make({"dense": 1 / 3, "keyword": 1 / 3, "colbert": 1 / 3}, doc=True),
        "rocchio_fused+kw+colbert 1/3": make(
            {"rocchio_fused": 1 / 3, "keyword": 1 / 3, "colbert": 1 / 3},
            cand_legs=("rocchio_fused", "keyword"),
        ),
        "dense+rocchio_fused+kw+colbert 1/4": make(
            {"dense": 0.25, "rocchio_fused": 0.25, "keyword": 0.25, "colbert": 0.25},
            cand_legs=("dense", "rocchio_fused", "keyword"),
        ),
        "dense+rocchio_fused+kw 1/4,1/4,1/2": make(
            {"dense": 0.25, "rocchio_fused": 0.25, "keyword": 0.5},
            cand_legs=("dense", "rocchio_fused", "keyword"),
        ),
        "kw+colbert .5/.5": make({"keyword": 0.5, "colbert": 0.5}),
        "dense+rm3+colbert 1/3": make(
            {"dense": 1 / 3, "rm3": 1 / 3, "colbert": 1 / 3}, cand_legs=("dense", "rm3")
        ),
        "dense z + kw .5/.5": make({"dense": 0.5, "keyword": 0.5}, dense_norm="z"),
        "dense raw cos + kw .5/.5": make({"dense": 0.5, "keyword": 0.5}, dense_norm="cos"),
    }
    for depth in (10, 20, 30, 50, 100):
        for weight in (0.2, 0.33, 0.5, 0.67):
            table[f"colbert rerank top {depth} w {weight}"] = colbert_rerank(depth, weight)
    table["multifield alone"] = make({"multifield": 1.0}, cand_legs=("multifield",))
    table["dense + multifield .5/.5"] = make(
        {"dense": 0.5, "multifield": 0.5}, cand_legs=("dense", "multifield")
    )
    table["dense + kw + multifield .5/.25/.25"] = make(
        {"dense": 0.5, "keyword": 0.25, "multifield": 0.25}, cand_legs=("dense", "keyword", "multifield")
    )
    for w in (0.3, 0.4, 0.6, 0.7):
        table[f"dense {w} + kw {1 - w:.1f}"] = make({"dense": w, "keyword": 1 - w})
        table[f"dense {w} + kw {1 - w:.1f} doc"] = make({"dense": w, "keyword": 1 - w}, doc=True)
    return table


def score(
    data: Collected, qrels: dict[str, dict[str, int]], only: str | None = None, baseline: str | None = None
) -> dict[str, dict[str, float]]:
    """nDCG@10 and Recall@100 of every variant; with a baseline, the paired nDCG@10 difference per query."""
    report: dict[str, dict[str, float]] = {}
    judged = {q: qrels[q] for q in data.queries}
    table = variants()
    base: npt.NDArray[np.float64] | None = None
    if baseline:
        base = _per_query(table[baseline], data, judged)
    for name, variant in table.items():
        if only and only not in name:
            continue
        if "colbert" in name and not any(q.colbert for q in data.queries.values()):
            continue
        if "rm3" in name and not any(q.rm3 for q in data.queries.values()):
            continue
        if "multifield" in name and not any(q.multifield for q in data.queries.values()):
            continue
        rankings = {
            qid: [x for x in variant(legs, data.document_of) if x != qid]
            for qid, legs in data.queries.items()
        }
        metrics = score_run(judged, rankings)
        report[name] = {
            "ndcg@10": round(metrics["ndcg@10"], 4),
            "recall@100": round(metrics["recall@100"], 4),
        }
        line = f"{report[name]['ndcg@10']:.4f}  {report[name]['recall@100']:.4f}  {name}"
        if base is not None:
            diff = _per_query(variant, data, judged) - base
            error = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
            report[name].update(diff=round(float(diff.mean()), 4), stderr=round(error, 4))
            ups, downs = int((diff > 0).sum()), int((diff < 0).sum())
            line += f"  (diff {diff.mean():+.4f} +- {error:.4f}, {ups}/{downs} up/down)"
        print(line, flush=True)
    return report


def _per_query(
    variant: Callable[[QueryLegs, Mapping[str, str]], list[str]],
    data: Collected,
    qrels: dict[str, dict[str, int]],
) -> npt.NDArray[np.float64]:
    rankings = {
        qid: [x for x in variant(legs, data.document_of) if x != qid] for qid, legs in data.queries.items()
    }
    measured = score_queries(qrels, rankings)
    return np.array([measured.get(q, {}).get("ndcg@10", 0.0) for q in data.queries])


# ---- a calibrated combination: logistic regression on the legs' scores ----------------------------------

FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "dense+bm25": ("dense_norm", "keyword_norm"),
    "dense+bm25+multifield": ("dense_norm", "keyword_norm", "multifield_norm"),
    "dense+bm25+colbert": ("dense_norm", "keyword_norm", "colbert_norm"),
    "all": ("dense_norm", "dense_raw", "keyword_norm", "multifield_norm", "colbert_norm", "colbert_raw"),
}


def _features(q: QueryLegs) -> tuple[list[str], dict[str, npt.NDArray[np.float64]]]:
    """Every first-pass candidate (dense top pool + BM25 top pool) and its per-leg features."""
    cands = sorted(q.dense_top_set | q.keyword.keys())
    dense = min_max(_restrict(q.dense, cands))
    keyword = _bm25_norm(q.keyword)
    multifield = _bm25_norm(_restrict(q.multifield, cands))
    colbert = min_max(_restrict(q.colbert, cands))
    columns = {
        "dense_norm": [dense.get(c, 0.0) for c in cands],
        "dense_raw": [q.dense.get(c, 0.0) for c in cands],
        "keyword_norm": [keyword.get(c, 0.0) for c in cands],
        "multifield_norm": [multifield.get(c, 0.0) for c in cands],
        "colbert_norm": [colbert.get(c, 0.0) for c in cands],
        "colbert_raw": [q.colbert.get(c, 0.0) for c in cands],
    }
    return cands, {k: np.array(v, dtype=np.float64) for k, v in columns.items()}


def _design(
    data: Collected, qids: Sequence[str], names: tuple[str, ...], qrels: Mapping[str, Mapping[str, int]]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    rows, labels = [], []
    for qid in qids:
        cands, cols = _features(data.queries[qid])
        rows.append(np.stack([cols[n] for n in names], axis=1))
        judged = qrels.get(qid, {})
        labels.append(np.array([int(judged.get(data.document_of[c], 0) > 0) for c in cands]))
    return np.concatenate(rows), np.concatenate(labels)


def _rank_with(
    data: Collected, qids: Sequence[str], names: tuple[str, ...], weights: npt.NDArray[np.float64]
) -> dict[str, list[str]]:
    rankings = {}
    for qid in qids:
        cands, cols = _features(data.queries[qid])
        values = np.stack([cols[n] for n in names], axis=1) @ weights
        scores = dict(zip(cands, values.tolist(), strict=True))
        rankings[qid] = [x for x in documents(scores, data.document_of) if x != qid]
    return rankings


def _fit(x: npt.NDArray[np.float64], y: npt.NDArray[np.int64], c: float) -> npt.NDArray[np.float64]:
    from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

    model = LogisticRegression(C=c, max_iter=1000)
    model.fit(x, y)
    weights: npt.NDArray[np.float64] = model.coef_[0].astype(np.float64)
    return weights


def calibrate(
    train: Collected,
    train_qrels: dict[str, dict[str, int]],
    test: Collected | None,
    test_qrels: dict[str, dict[str, int]] | None,
    folds: int = 5,
    only: str | None = None,
) -> dict[str, Any]:
    """Logistic regression on the legs' per-candidate scores (label: the chunk's document is relevant).

    On train: grouped k-fold cross-validation by query (each fold's model ranks only its held-out
    queries), paired against today's fusion. With a test set: one model fitted on all of train.
    """
    report: dict[str, Any] = {}
    today = variants()["today (chunk, minmax+bm25/best, .5/.5)"]
    qids = list(train.queries)
    rng = np.random.default_rng(17)
    order = rng.permutation(len(qids))
    fold_of = {qids[i]: n % folds for n, i in enumerate(order)}
    judged = {q: train_qrels[q] for q in qids}
    base_rank = {q: [x for x in today(train.queries[q], train.document_of) if x != q] for q in qids}
    base = score_queries(judged, base_rank)
    for set_name, names in FEATURE_SETS.items():
        if "colbert_norm" in names and not any(q.colbert for q in train.queries.values()):
            continue
        for c in (0.01, 1.0, 100.0):
            if only and only != f"{set_name} C={c}":
                continue
            rankings: dict[str, list[str]] = {}
            for fold in range(folds):
                fit_on = [q for q in qids if fold_of[q] != fold]
                held = [q for q in qids if fold_of[q] == fold]
                weights = _fit(*_design(train, fit_on, names, train_qrels), c)
                rankings.update(_rank_with(train, held, names, weights))
            measured = score_queries(judged, rankings)
            diff = np.array(
                [measured.get(q, {}).get("ndcg@10", 0.0) - base.get(q, {}).get("ndcg@10", 0.0) for q in qids]
            )
            metrics = score_run(judged, rankings)
            weights = _fit(*_design(train, qids, names, train_qrels), c)
            entry: dict[str, Any] = {
                "features": list(names),
                "C": c,
                "train_cv_ndcg@10": round(metrics["ndcg@10"], 4),
                "train_cv_recall@100": round(metrics["recall@100"], 4),
                "train_cv_diff": round(float(diff.mean()), 4),
                "train_cv_stderr": round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 4),
                "weights_all_train": [round(float(w), 4) for w in weights],
            }
            if test is not None and test_qrels is not None:
                tq = list(test.queries)
                tj = {q: test_qrels[q] for q in tq}
                trank = _rank_with(test, tq, names, weights)
                tbase = score_queries(
                    tj, {q: [x for x in today(test.queries[q], test.document_of) if x != q] for q in tq}
                )
                tm = score_queries(tj, trank)
                tdiff = np.array(
                    [tm.get(q, {}).get("ndcg@10", 0.0) - tbase.get(q, {}).get("ndcg@10", 0.0) for q in tq]
                )
                tmetrics = score_run(tj, trank)
                entry.update(
                    test_ndcg_at_10=round(tmetrics["ndcg@10"], 4),
                    test_recall_at_100=round(tmetrics["recall@100"], 4),
                    test_diff=round(float(tdiff.mean()), 4),
                    test_stderr=round(float(tdiff.std(ddof=1) / np.sqrt(len(tdiff))), 4),
                )
            report[f"{set_name} C={c}"] = entry
            print(f"{set_name} C={c}: {json.dumps(entry)}", flush=True)
    return report


def latency(
    collection_id: str, queries: list[str], variants: dict[str, dict[str, Any]], top_k: int, warmup: int
) -> dict[str, Any]:
    """rag_hybrid_ifind's call per technique_params variant, alternating per query, each encoding afresh.

    The embedder remembers a query's vector for the next call of the same query; here every call starts
    without it (as bench_techniques', where each technique encodes its own query), so no variant gets its
    encode free from the one before. In process, generation off, the result cache off (CACHE_ENABLED).
    """
    from bench.common import machine, percentiles
    from iris_rag.runtime import limit_blas_threads

    limit_blas_threads()  # as the worker does: one BLAS thread per call, not one per core
    service = RagService(Settings())
    service.embedder.wait_ready()
    recent: Any = getattr(service.embedder, "_recent_queries", {})
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu_times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for i, query in enumerate(queries[:warmup] + queries):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                recent.clear()
                arguments = {
                    "query": query,
                    "collection_id": collection_id,
                    "technique_params": variants[name],
                    "options": {"top_k": top_k, "generate": False},
                }
                started, cpu = time.perf_counter(), time.process_time()
                service.execute({"technique": "hybrid_ifind", "arguments": arguments})
                if i >= warmup:
                    times[name].append((time.perf_counter() - started) * 1000)
                    cpu_times[name].append((time.process_time() - cpu) * 1000)
    finally:
        service.close()
    summary = {name: percentiles(samples) for name, samples in times.items()}
    first = summary[names[0]]
    return {
        "benchmark": "rag_hybrid_ifind call per variant (ms, in process, no generation, fresh encodes)",
        "collection": collection_id,
        "queries": len(queries),
        "top_k": top_k,
        "variants": variants,
        "latency_ms": summary,
        # The process's CPU time per call (every thread): the work itself, less sensitive to a loaded machine.
        "cpu_ms": {name: percentiles(samples) for name, samples in cpu_times.items()},
        "p50_ratio_to_first": {n: round(summary[n]["p50"] / first["p50"], 3) for n in names},
        "p95_ratio_to_first": {n: round(summary[n]["p95"] / first["p95"], 3) for n in names},
        "machine": machine(),
    }


def subset(dataset_path: Path, collection_id: str, out: Path) -> None:
    """A BEIR folder of the corpus documents the collection holds, and of the judgments on them.

    For a collection that holds part of the corpus (a snapshot of an ingest under way): each split keeps
    the queries with at least one relevant document in the collection, and only those judgments.
    """
    service = RagService(Settings())
    try:
        held = set(service.store.document_ids(collection_id))
    finally:
        service.close()
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (
        (dataset_path / "corpus.jsonl").open(encoding="utf-8") as source,
        (out / "corpus.jsonl").open("w", encoding="utf-8") as target,
    ):
        target.writelines(line for line in source if line.strip() and str(json.loads(line)["_id"]) in held)
    for split, queries_file in (("train", "queries_train.jsonl"), ("test", "queries.jsonl")):
        qrels = dataset_path / "qrels" / f"{split}.tsv"
        if not qrels.exists():
            continue
        header, *rows = [line.rstrip("\n").split("\t") for line in qrels.open(encoding="utf-8")]
        kept = [row for row in rows if len(row) >= 3 and row[1] in held]
        queries = {row[0] for row in kept}
        (out / "qrels" / f"{split}.tsv").write_text(
            "".join("\t".join(row) + "\n" for row in [header, *kept]), encoding="utf-8"
        )
        with (
            (dataset_path / queries_file).open(encoding="utf-8") as source,
            (out / f"queries_{split}.jsonl").open("w", encoding="utf-8") as target,
        ):
            target.writelines(
                line for line in source if line.strip() and str(json.loads(line)["_id"]) in queries
            )
        print(f"subset: {split}: {len(queries)} queries, {len(kept)} judgments", file=sys.stderr)
    print(f"subset: {len(held)} documents", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--dataset", type=Path, required=True)
    c.add_argument("--split", default="train")
    c.add_argument("--collection", default="eval-scifact")
    c.add_argument("--pool", type=int, default=100)
    c.add_argument("--limit", type=int, default=0)
    c.add_argument("--colbert", action="store_true")
    c.add_argument("--no-rm3", action="store_true", help="skip the two RM3 legs (they lost, and cost most)")
    c.add_argument("--colbert-threshold", type=float, help="ColBERT interaction_threshold (default 0.5)")
    c.add_argument("--colbert-ratio", type=float, help="ColBERT compression_ratio (default 0.8)")
    c.add_argument("--out", type=Path, required=True)
    b = sub.add_parser("subset", help="a BEIR folder restricted to the documents a collection holds")
    b.add_argument("--dataset", type=Path, required=True)
    b.add_argument("--collection", default="eval-scifact")
    b.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score")
    s.add_argument("data", type=Path)
    s.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    s.add_argument("--only")
    s.add_argument("--baseline", help="a variant's name: print each variant's paired nDCG@10 difference")
    s.add_argument("--json", type=Path, help="write the report here")
    k = sub.add_parser("calibrate", help="logistic regression on the legs' scores, cross-validated on train")
    k.add_argument("train", type=Path)
    k.add_argument("--test", type=Path, help="also score the model fitted on all of train on this split")
    k.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    k.add_argument("--json", type=Path, help="write the report here")
    k.add_argument("--only", help='one feature set and C, e.g. "dense+bm25+colbert C=1.0"')
    t = sub.add_parser("latency", help="the call's latency per technique_params variant, alternating")
    t.add_argument("--collection", default="eval-scifact")
    t.add_argument("--queries", type=Path, default=Path("../shared/data/scifact/queries.jsonl"))
    t.add_argument("--queries-limit", type=int, default=300)
    t.add_argument("--variant", action="append", required=True, help="NAME=<technique_params JSON>")
    t.add_argument("--top-k", type=int, default=5)
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.command == "latency":
        from bench.common import read_jsonl

        texts = [str(q["text"]) for q in read_jsonl(args.queries, args.queries_limit)]
        chosen = {name: json.loads(text) for name, _, text in (v.partition("=") for v in args.variant)}
        measured = latency(args.collection, texts, chosen, args.top_k, args.warmup)
        print(json.dumps(measured["latency_ms"]), json.dumps(measured["cpu_ms"]), file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps(measured, indent=2))
        return 0
    if args.command == "calibrate":
        train = pickle.loads(args.train.read_bytes())
        test = pickle.loads(args.test.read_bytes()) if args.test else None
        calibration = calibrate(
            train,
            load_beir(args.dataset, train.split).qrels,
            test,
            load_beir(args.dataset, test.split).qrels if test else None,
            only=args.only,
        )
        if args.json:
            args.json.write_text(json.dumps(calibration, indent=2))
        return 0
    if args.command == "subset":
        subset(args.dataset, args.collection, args.out)
        return 0
    if args.command == "collect":
        dataset = load_beir(args.dataset, args.split)
        if args.limit:
            dataset = dataset.limited(args.limit)
        service = RagService(Settings())
        try:
            data = collect(
                service,
                dataset,
                args.collection,
                args.pool,
                colbert=args.colbert,
                rm3=not args.no_rm3,
                colbert_params={
                    key: value
                    for key, value in (
                        ("interaction_threshold", args.colbert_threshold),
                        ("compression_ratio", args.colbert_ratio),
                    )
                    if value is not None
                },
            )
        finally:
            service.close()
        args.out.write_bytes(pickle.dumps(data))
        return 0
    data = pickle.loads(args.data.read_bytes())
    dataset = load_beir(args.dataset, data.split)
    report = score(data, dataset.qrels, args.only, args.baseline)
    if args.json:
        args.json.write_text(
            json.dumps({"split": data.split, "queries": len(data.queries), "variants": report}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

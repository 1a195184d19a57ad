"""Pseudo-relevance feedback: the first pass's best chunks expand the query, for a second pass.

RM3 expands the keyword leg's terms (Abdul-Jaleel et al. 2004, with Anserini's defaults); Rocchio moves the
dense leg's query vector toward the best chunks' vectors (Rocchio 1971; for dense retrievers, Li et al.
2022). Both use fixed, published parameters: nothing here is tuned on a benchmark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from iris_rag.text import stem, text_terms

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
        stems = [stem(t) for t in text_terms(text) if len(t) > 1 and not t.isdigit()]
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

"""Turning free text into a safe full-text query: fuzzy repair of misspelled terms, RM3 query expansion."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rapidfuzz import fuzz, process

from iris_rag.text import stem, text_terms


@dataclass
class FuzzyRepair:
    """Which query terms had no match in the index, and the indexed terms used in their place."""

    expansions: dict[str, list[str]] = field(default_factory=dict)

    @property
    def extra_terms(self) -> list[str]:
        """Every replacement term, in order, without repeats."""
        return list(dict.fromkeys(t for ts in self.expansions.values() for t in ts))


def unknown_terms(terms: list[str], vocabulary: dict[str, int]) -> list[str]:
    """The terms whose stem the index does not hold."""
    return [t for t in terms if stem(t) not in vocabulary]


def repair_terms(
    unknown: list[str], vocabulary: dict[str, int], *, limit: int = 2, min_similarity: float = 80.0
) -> FuzzyRepair:
    """For each term the index does not know, the closest indexed terms (at most `limit`, not flooding).

    Indexed terms are Porter stems ("diabetes" is stored as "diabet"), so the misspelling is stemmed too
    ("diabtes" -> "diabt") and compared by normalized edit similarity; among equally close terms the more
    frequent wins. Short terms are left alone: at three letters every neighbour is a different word.
    """
    repair = FuzzyRepair()
    candidates = list(vocabulary)
    for term in unknown:
        if len(term) < 4 or term.isdigit():
            continue
        matches = process.extract(
            stem(term), candidates, scorer=fuzz.ratio, score_cutoff=min_similarity, limit=10
        )
        ranked = sorted(matches, key=lambda m: (-m[1], -vocabulary[m[0]]))
        chosen = [m[0] for m in ranked if len(m[0]) >= 3][:limit]
        if chosen:
            repair.expansions[term] = chosen
    return repair


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

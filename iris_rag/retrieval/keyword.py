"""Turning free text into a safe full-text query, with optional fuzzy repair of misspelled terms."""

from __future__ import annotations

from dataclasses import dataclass, field

from rapidfuzz import fuzz, process

from iris_rag.text import stem


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

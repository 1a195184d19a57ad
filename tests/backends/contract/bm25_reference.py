"""BM25 computed by hand, the way FTS5 computes it: the reference every backend's keyword scores must equal.

k1 1.2, b 0.75, IDF log((N - n + 0.5) / (n + 0.5)) floored at 1e-6, N the rows searched (the collection's
chunks; for a field, the chunks holding that field), n those holding the term, avgdl their mean length.
A term of weight w counts w times. Texts are lowercase words that stemmers leave distinct, so a split is
the tokenizer.

flat: one BM25 over title and content together: the title's term frequency times title_weight, one
length (both fields' words). multifield: each field's own BM25, combined as max + 0.5 x min of the
title's (times title_weight) and the content's (Elasticsearch best_fields, tie_breaker 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

K1, B = 1.2, 0.75
IDF_FLOOR = 1e-6

# chunk or document key -> (title, content, metadata)
Corpus = Mapping[str, tuple[str, str, dict[str, Any]]]
Terms = Mapping[str, int] | list[str]


def _weights(terms: Terms) -> dict[str, int]:
    return dict.fromkeys(terms, 1) if isinstance(terms, list) else dict(terms)


def _idf(rows: int, holding: int) -> float:
    return max(math.log((rows - holding + 0.5) / (holding + 0.5)), IDF_FLOOR)


def _saturated(tf: float, length: int, avgdl: float) -> float:
    return tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avgdl))


def hand_bm25(texts: Mapping[str, str], terms: Terms) -> dict[str, float]:
    """BM25 of every text holding a term, over a one-field table of exactly these texts."""
    weights = _weights(terms)
    tokens = {key: text.split() for key, text in texts.items()}
    n_rows = len(tokens)
    avgdl = sum(len(t) for t in tokens.values()) / n_rows
    scores: dict[str, float] = {}
    for key, words in tokens.items():
        if not any(term in words for term in weights):
            continue
        score = 0.0
        for term, weight in weights.items():
            idf = _idf(n_rows, sum(term in w for w in tokens.values()))
            score += weight * idf * _saturated(words.count(term), len(words), avgdl)
        scores[key] = score
    return scores


def hand_flat(corpus: Corpus, terms: Terms, title_weight: float = 1.0) -> dict[str, float]:
    """One BM25 over both fields (FTS5 bm25(table, title_weight, 1.0)); chunk ids '<key>#0' as keys."""
    weights = _weights(terms)
    fields = {key: (title.split(), content.split()) for key, (title, content, _) in corpus.items()}
    n_rows = len(fields)
    avgdl = sum(len(t) + len(c) for t, c in fields.values()) / n_rows
    scores: dict[str, float] = {}
    for key, (title, content) in fields.items():
        if not any(term in title or term in content for term in weights):
            continue
        score = 0.0
        for term, weight in weights.items():
            idf = _idf(n_rows, sum(term in t or term in c for t, c in fields.values()))
            tf = title_weight * title.count(term) + content.count(term)
            score += weight * idf * _saturated(tf, len(title) + len(content), avgdl)
        scores[f"{key}#0"] = score
    return scores


def hand_multifield(corpus: Corpus, terms: Terms, title_weight: float = 1.0) -> dict[str, float]:
    """max + 0.5 x min of the two fields' BM25, the title's times title_weight; chunk ids as keys."""
    title = hand_bm25({i: t for i, (t, _, _) in corpus.items() if t}, terms)
    content = hand_bm25({i: c for i, (_, c, _) in corpus.items()}, terms)
    combined = {}
    for doc_id in title.keys() | content.keys():
        t, c = title_weight * title.get(doc_id, 0.0), content.get(doc_id, 0.0)
        combined[f"{doc_id}#0"] = max(t, c) + 0.5 * min(t, c)
    return combined

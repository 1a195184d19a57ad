"""Keyword scores equal BM25 computed by hand (bm25_reference), flat and multifield, with term weights."""

from __future__ import annotations

from typing import Any

import pytest

from iris_rag.stores.base import DocumentStore, KeywordQuery, KeywordScoring
from tests.backends.contract.bm25_reference import Corpus, hand_flat, hand_multifield
from tests.backends.contract.corpus import document, new_collection

# id -> (title, content, metadata), one chunk each. "g" has no title. Words no stemmer merges or drops.
CORPUS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "a": ("alpha", "one two three four five six seven eight nine ten", {"year": 2020}),
    "b": ("gamma delta epsilon", "alpha one two three", {"year": 2021}),
    "c": ("alpha beta gamma", "beta beta one two", {"year": 2022}),
    "d": ("delta epsilon zeta", "four five six", {"year": 2020}),
    "e": ("eta theta iota", "seven eight nine beta", {"year": 2021}),
    "f": ("kappa lambda mu", "ten one two", {"year": 2022}),
    "g": ("", "alpha two", {"year": 2021}),
}

QUERIES: list[dict[str, int]] = [
    {"alpha": 1},
    {"beta": 1},
    {"alpha": 1, "beta": 1},
    {"alpha": 1, "two": 1},
    {"alpha": 2, "beta": 1},
    {"beta": 3, "ten": 1},
    {"zeta": 1, "omega": 1},
]


def load(store: DocumentStore, corpus: Corpus = CORPUS) -> None:
    new_collection(store)
    store.upsert_documents(
        "c", [document(i, [content], title, m) for i, (title, content, m) in corpus.items()]
    )


def search(store: DocumentStore, query: KeywordQuery, top_k: int = 100) -> dict[str, float]:
    hits = store.keyword_search("c", query, top_k)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    return {h.chunk_id: h.score for h in hits}


def reference(scoring: KeywordScoring, corpus: Corpus, terms: dict[str, int], title_weight: float) -> Any:
    compute = hand_flat if scoring == "flat" else hand_multifield
    return {k: pytest.approx(v, rel=1e-6) for k, v in compute(corpus, terms, title_weight).items()}


@pytest.mark.parametrize("scoring", ["flat", "multifield"])
@pytest.mark.parametrize("title_weight", [1.0, 2.5])
@pytest.mark.parametrize("terms", QUERIES, ids=[str(q) for q in QUERIES])
def test_scores_are_reference_bm25(
    store: DocumentStore, scoring: KeywordScoring, title_weight: float, terms: dict[str, int]
) -> None:
    load(store)
    query = KeywordQuery(terms, title_weight, scoring)
    assert search(store, query) == reference(scoring, CORPUS, terms, title_weight)


@pytest.mark.parametrize("scoring", ["flat", "multifield"])
def test_a_term_weight_counts_the_term_that_many_times(store: DocumentStore, scoring: KeywordScoring) -> None:
    load(store)
    once = search(store, KeywordQuery({"beta": 1}, scoring=scoring))
    twice = search(store, KeywordQuery({"beta": 2}, scoring=scoring))
    assert twice == {k: pytest.approx(2 * v, rel=1e-6) for k, v in once.items()}
    # Weighting one term changes the ranking: the rarer "zeta" leads alone; "ten" x3 puts it last.
    plain = store.keyword_search("c", KeywordQuery({"ten": 1, "zeta": 1}, scoring=scoring), 10)
    heavy = store.keyword_search("c", KeywordQuery({"ten": 3, "zeta": 1}, scoring=scoring), 10)
    assert [h.chunk_id for h in plain] == ["d#0", "f#0", "a#0"]
    assert [h.chunk_id for h in heavy] == ["f#0", "a#0", "d#0"]


def test_flat_and_multifield_rank_differently(store: DocumentStore) -> None:
    # "short": a one-word title on a long text; "mid": the term once in an ordinary text. One length for
    # both fields buries the title match (flat); the title's own length normalization lifts it.
    filler = "one two three four five six seven eight nine ten eleven"
    corpus: dict[str, tuple[str, str, dict[str, Any]]] = {
        "short": ("alpha", f"{filler} {filler} {filler}", {}),
        "mid": ("gamma delta epsilon", "alpha one two three four five", {}),
        **{f"x{i}": ("zeta eta theta", "four five six seven eight nine", {}) for i in range(5)},
    }
    load(store, corpus)
    flat = store.keyword_search("c", KeywordQuery.of(["alpha"]), 10)
    multi = store.keyword_search("c", KeywordQuery.of(["alpha"], scoring="multifield"), 10)
    assert [h.chunk_id for h in flat] == ["mid#0", "short#0"]
    assert [h.chunk_id for h in multi] == ["short#0", "mid#0"]


@pytest.mark.parametrize("scoring", ["flat", "multifield"])
def test_top_k_is_the_best_k(store: DocumentStore, scoring: KeywordScoring) -> None:
    load(store)
    query = KeywordQuery({"alpha": 1, "beta": 1, "two": 1}, scoring=scoring)
    everything = search(store, query)
    best = sorted(everything.items(), key=lambda item: -item[1])[:3]
    assert [(h.chunk_id, h.score) for h in store.keyword_search("c", query, 3)] == best


def test_scores_follow_replace_and_delete(store: DocumentStore) -> None:
    load(store)
    corpus = dict(CORPUS)
    corpus["c"] = ("omega", "beta one", {"year": 2022})
    corpus["e"] = ("", "seven eight nine beta", {"year": 2021})
    store.upsert_documents("c", [document(i, [corpus[i][1]], corpus[i][0], corpus[i][2]) for i in ("c", "e")])
    assert store.delete_document("c", "a")
    del corpus["a"]
    for scoring in ("flat", "multifield"):
        for terms in ({"alpha": 1}, {"beta": 1, "omega": 2}, {"one": 1, "ten": 1}):
            query = KeywordQuery(terms, 1.5, scoring)
            assert search(store, query) == reference(scoring, corpus, terms, 1.5)


def test_no_term_matches_nothing_and_terms_are_never_syntax(store: DocumentStore) -> None:
    load(store)
    assert store.keyword_search("c", KeywordQuery({}), 10) == []
    assert store.keyword_search("c", KeywordQuery.of(["omega"]), 10) == []
    for odd in ['"', "alpha OR", "NEAR(alpha beta)", "alpha*", "'", ":", "-beta", "(", "&|!"]:
        store.keyword_search("c", KeywordQuery.of([odd]), 10)
        store.keyword_search("c", KeywordQuery.of([odd], scoring="multifield"), 10)


def test_term_document_counts(store: DocumentStore) -> None:
    load(store)
    words = [set((title + " " + content).split()) for title, content, _ in CORPUS.values()]
    counts = store.term_document_counts("c")
    # Terms are the backend's stems ("one" may be "on"): one per distinct word here, and these words
    # are their own stem in any English stemmer.
    assert len(counts) == len(set().union(*words))
    for term, expected in {"alpha": 4, "beta": 2, "two": 5, "zeta": 1, "gamma": 2, "delta": 2}.items():
        assert sum(term in w for w in words) == expected
        assert counts[term] == expected, term

"""Issue 17, item 2: evidence beyond rag_hybrid_ifind's two legs, measured over every chunk of a BEIR build.

    RAG_DATA_DIR=data .venv/bin/python -m bench.quality_signals encode --dataset ../shared/data/scifact \
        --out /tmp/signals.pkl
    .venv/bin/python -m bench.quality_signals score /tmp/signals.pkl --split train \
        --json bench/results/quality/signals_train.json

`encode` reads the collection's chunks from the SQLite store that `iris-rag eval` built (chunk and document
ids, title, text and the stored chunk vector), then embeds with the collection's model every query of the
dataset, every sentence of every chunk (`title` + newline + sentence, as a chunk is embedded with its title)
and every document's title. `score` ranks every query of a split in memory: the exact cosine of every chunk
and the flat BM25 of every chunk (the store's terms and formula: FTS5's tokenizer, k1 1.2, b 0.75), each
leg's top `POOL`, fused as the technique fuses (cosines min-max scaled over the candidates, BM25 divided by
its best, 0.5 / 0.5; a document ranks at its best chunk), then the same candidates under each variant,
each paired per query against today's fusion (mean nDCG@10 difference and its standard error). The
fusion is the technique's own function (retrieval.fusion.weighted_sum) and every leg exact, as the store's
are on SciFact, so today's fusion scores what `bench.quality_fusion` gets through the store at the same
pool (0.7389 train, 0.7388 test), though the query vectors here come from sentence-transformers' torch
model (the worker encodes queries with ONNX Runtime).

`learn` trains a gradient-boosted ranker over every candidate's signals; `adapt` keeps today's two legs and
gives each query its own dense weight, predicted from query-performance predictors (QUERY_FEATURES).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pickle
import sqlite3
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from iris_rag.backends.common.bm25 import query_stems, tokenize
from iris_rag.evaluation.beir import Qrels, load_beir
from iris_rag.evaluation.metrics import score_queries
from iris_rag.retrieval.fusion import WeightedLeg, weighted_sum
from iris_rag.runtime import limit_blas_threads
from iris_rag.settings import Settings
from iris_rag.stores.base import BM25_B as B
from iris_rag.stores.base import BM25_K1 as K1
from iris_rag.text import embedding_text, query_terms, split_sentences

Floats = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
POOL = 100
"""Each leg's candidates, as a client's call fuses them (candidate_pool 100)."""


@dataclass
class Signals:
    """A build's chunks and the vectors `score` needs (what `encode` writes)."""

    chunk_ids: list[str]
    document_ids: list[str]
    titles: list[str]
    texts: list[str]
    chunk_vectors: npt.NDArray[np.float32]
    queries: dict[str, str]
    query_vectors: npt.NDArray[np.float32]  # rows in `queries` order
    sentence_owner: Rows  # each sentence's chunk row
    sentence_vectors: npt.NDArray[np.float32]
    title_vectors: npt.NDArray[np.float32]  # one row per chunk: its document's title
    query_row: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.query_row = {query_id: row for row, query_id in enumerate(self.queries)}

    def fields(self) -> dict[str, Any]:
        """What `encode` writes: plain values (a pickled class would be __main__'s under python -m)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}


def embed(model: Any, strings: list[str], *, progress: bool = False) -> npt.NDArray[np.float32]:
    """Unit vectors of the strings from a sentence-transformers model, as float32 rows."""
    vectors = model.encode(strings, batch_size=64, normalize_embeddings=True, show_progress_bar=progress)
    return np.asarray(vectors, dtype=np.float32)


def encode(data_dir: Path, dataset: Path, collection_id: str) -> Signals:
    """Read the collection's chunks from the SQLite store, embed queries, sentences and titles."""
    from sentence_transformers import SentenceTransformer

    from iris_rag.embedder import resolve_model_path

    database = sqlite3.connect(f"file:{data_dir / 'iris_rag.sqlite3'}?mode=ro", uri=True)
    rows = database.execute(
        "SELECT c.chunk_id, c.document_id, d.title, c.content, c.embedding FROM chunks c JOIN documents d"
        " ON d.collection_id = c.collection_id AND d.id = c.document_id WHERE c.collection_id = ?"
        " ORDER BY c.rowid",
        (collection_id,),
    ).fetchall()
    if not rows:
        sys.exit(f"no chunks in collection {collection_id!r}: build it with iris-rag eval first")
    titles = [str(row[2]) for row in rows]
    texts = [str(row[3]) for row in rows]
    model = SentenceTransformer(resolve_model_path(Settings().embedding_model), device="cpu")

    queries = {**load_beir(dataset, "train").queries, **load_beir(dataset, "test").queries}
    owner, sentences = [], []
    for row, (title, text) in enumerate(zip(titles, texts, strict=True)):
        for span in split_sentences(text):
            owner.append(row)
            sentences.append(embedding_text(title, span.text))
    distinct_titles = sorted(set(titles))
    title_vectors = embed(model, distinct_titles, progress=True)
    title_row = {title: row for row, title in enumerate(distinct_titles)}
    return Signals(
        chunk_ids=[str(row[0]) for row in rows],
        document_ids=[str(row[1]) for row in rows],
        titles=titles,
        texts=texts,
        chunk_vectors=np.stack([np.frombuffer(row[4], dtype=np.float32) for row in rows]),
        queries=queries,
        query_vectors=embed(model, list(queries.values()), progress=True),
        sentence_owner=np.asarray(owner, dtype=np.intp),
        sentence_vectors=embed(model, sentences, progress=True),
        title_vectors=title_vectors[[title_row[title] for title in titles]],
    )


class Bm25:
    """Flat BM25 over every chunk (title and text as one field), postings and positions in memory.

    The terms are the store's (FTS5's tokenizer, bm25.tokenize) and so is the formula (FTS5's IDF);
    it is written out here, not taken from iris_rag.backends.common.bm25, because two variants need what
    the store's fixed k1 and b and its bag of terms cannot give: other k1 and b, and term positions.
    """

    def __init__(self, titles: list[str], texts: list[str]) -> None:
        postings: dict[str, tuple[list[int], list[int]]] = {}
        self.positions: list[dict[str, Rows]] = []
        lengths = []
        for row, tokens in enumerate(tokenize([f"{t} {x}" for t, x in zip(titles, texts, strict=True)])):
            lengths.append(len(tokens))
            where: dict[str, list[int]] = {}
            for position, token in enumerate(tokens):
                where.setdefault(token, []).append(position)
            for term, count in Counter(tokens).items():
                rows, counts = postings.setdefault(term, ([], []))
                rows.append(row)
                counts.append(count)
            self.positions.append({term: np.asarray(p, dtype=np.intp) for term, p in where.items()})
        self.postings = {
            term: (np.asarray(rows, dtype=np.intp), np.asarray(counts, dtype=np.float64))
            for term, (rows, counts) in postings.items()
        }
        self.lengths = np.asarray(lengths, dtype=np.float64)

    def idf(self, document_frequency: int) -> float:
        """FTS5's: ln((N - n + 0.5) / (n + 0.5)), at least 1e-6."""
        count = len(self.lengths)
        return max(float(np.log((count - document_frequency + 0.5) / (document_frequency + 0.5))), 1e-6)

    @staticmethod
    def stems(query: str) -> dict[str, int]:
        """The query's indexed stems and how often each counts, as the keyword leg asks for them."""
        return query_stems(dict.fromkeys(query_terms(query), 1))

    def saturate(self, rows: Rows, frequencies: Floats, k1: float, b: float) -> Floats:
        norm = k1 * (1 - b + b * self.lengths[rows] / self.lengths.mean())
        result: Floats = frequencies * (k1 + 1) / (frequencies + norm)
        return result

    def scores(self, query: str, k1: float = K1, b: float = B) -> Floats:
        """Every chunk's BM25 for the query's terms (stopwords left out)."""
        out = np.zeros(len(self.lengths))
        for term, weight in self.stems(query).items():
            if term in self.postings:
                rows, counts = self.postings[term]
                out[rows] += weight * self.idf(len(rows)) * self.saturate(rows, counts, k1, b)
        return out

    def pair_scores(self, query: str, window: int, *, ordered: bool) -> Floats:
        """Sequential dependence: BM25 of each pair of adjacent query terms, counted within `window`."""
        terms = [term for term in self.stems(query) if term in self.postings]
        out = np.zeros(len(self.lengths))
        for first, second in itertools.pairwise(terms):
            both = np.intersect1d(self.postings[first][0], self.postings[second][0])
            counts = np.asarray(
                [_near(self.positions[r][first], self.positions[r][second], window, ordered) for r in both],
                dtype=np.float64,
            )
            both, counts = both[counts > 0], counts[counts > 0]
            if len(both):
                out[both] += self.idf(len(both)) * self.saturate(both, counts, K1, B)
        return out


def _near(first: Rows, second: Rows, window: int, ordered: bool) -> int:
    """How often `second` follows `first` within `window` positions (ordered), or is within it either way."""
    gaps = second[None, :] - first[:, None]
    return int(
        ((gaps > 0) & (gaps <= window)).sum() if ordered else ((gaps != 0) & (abs(gaps) < window)).sum()
    )


@dataclass
class Query:
    """One query's inputs to the variants."""

    text: str
    vector: npt.NDArray[np.float32]
    dense: Floats  # every chunk's cosine
    keyword: Floats  # every chunk's BM25
    candidates: Rows  # the union of both legs' top POOL
    dense_top: Rows
    keyword_top: Rows


def _min_max(values: Floats) -> Floats:
    low, high = float(values.min()), float(values.max())
    return np.ones_like(values) if high == low else (values - low) / (high - low)


def fuse(query: Query, legs: list[tuple[float, Floats, bool]]) -> Floats:
    """The candidates' fused scores by the technique's own rule (retrieval.fusion.weighted_sum).

    Each leg is (weight, every chunk's score, natural zero). A natural-zero leg is a BM25 leg and scores
    only the chunks its search returned (its top POOL), as the technique's keyword leg does; a cosine leg
    scores every candidate (the technique computes the exact cosine of each).
    """
    keys = [str(row) for row in query.candidates.tolist()]
    returned = {str(row) for row in query.keyword_top.tolist()}
    weighted = [
        WeightedLeg(
            weight,
            {
                key: float(scores[row])
                for key, row in zip(keys, query.candidates.tolist(), strict=True)
                if not natural_zero or key in returned
            },
            natural_zero=natural_zero,
        )
        for weight, scores, natural_zero in legs
    ]
    totals, _ = weighted_sum(weighted, keys)
    return np.asarray([totals[key] for key in keys], dtype=np.float64)


def _top(scores: Floats, count: int, *, positive: bool) -> Rows:
    rows = np.flatnonzero(scores > 0) if positive else np.arange(len(scores))
    return rows[np.argsort(-scores[rows], kind="stable")[:count]]


Variant = Callable[[Query], Floats | tuple[Rows, Floats]]
"""A variant scores the query's candidates, or returns candidates of its own with their scores."""


class Variants:
    """Every variant measured, by name; each returns the candidates' fused scores."""

    def __init__(self, signals: Signals, bm25: Bm25) -> None:
        self.signals, self.bm25 = signals, bm25
        self._centred: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None
        self._grams: tuple[Any, Any] | None = None

    def sentences(self, query: Query) -> Floats:
        """Each chunk's best sentence cosine."""
        out = np.full(len(self.signals.chunk_ids), -1.0)
        np.maximum.at(out, self.signals.sentence_owner, self.signals.sentence_vectors @ query.vector)
        # (float64 throughout: the chunk cosines are float64 here)
        return out

    def smoothed(self, query: Query, share: float, neighbours: int) -> Floats:
        """Score regularization (Diaz 2005): each candidate's score moved towards its nearest candidates'."""
        scores = self.today(query)
        vectors = self.signals.chunk_vectors[query.candidates]
        similarity = vectors @ vectors.T
        np.fill_diagonal(similarity, -np.inf)
        nearest = np.argpartition(-similarity, neighbours, axis=1)[:, :neighbours]
        result: Floats = (1 - share) * scores + share * scores[nearest].mean(axis=1)
        return result

    def today(self, query: Query, dense_weight: float = 0.5) -> Floats:
        return fuse(query, [(dense_weight, query.dense, False), (1 - dense_weight, query.keyword, True)])

    def with_keyword(self, query: Query, keyword: Floats) -> tuple[Rows, Floats]:
        """Today's fusion with another keyword leg, whose own top POOL are the keyword candidates."""
        top = _top(keyword, POOL, positive=True)
        candidates = np.union1d(query.dense_top, top)
        moved = Query(query.text, query.vector, query.dense, keyword, candidates, query.dense_top, top)
        return candidates, self.today(moved)

    def gap_weighted(self, query: Query, power: float) -> Floats:
        """Each leg weighted by how far its own top stands out: (s1 - s10) / (s1 - s100), to a power."""

        def sharpness(scores: Floats, top: Rows) -> float:
            values = np.sort(scores[top])[::-1]
            if len(values) < 10 or values[0] == values[-1]:
                return 0.5
            share = float((values[0] - values[9]) / (values[0] - values[-1]))
            return float(share**power)

        dense, keyword = sharpness(query.dense, query.dense_top), sharpness(query.keyword, query.keyword_top)
        return self.today(query, dense / (dense + keyword) if dense + keyword > 0 else 0.5)

    def sentence_leg(self, query: Query, dense: float, sentence: float) -> Floats:
        """A third leg: each chunk's best sentence cosine; BM25 gets the rest of the weight."""
        keyword = round(1 - dense - sentence, 2)
        return fuse(
            query,
            [
                (dense, query.dense, False),
                (sentence, self.sentences(query), False),
                (keyword, query.keyword, True),
            ],
        )

    def sequential_dependence(self, query: Query) -> tuple[Rows, Floats]:
        """BM25 plus pairs of adjacent query terms (Metzler and Croft 2005: 0.1 ordered, 0.05 not)."""
        pairs = self.bm25.pair_scores(query.text, 2, ordered=True)
        near = self.bm25.pair_scores(query.text, 8, ordered=False)
        return self.with_keyword(query, query.keyword + 0.1 * pairs + 0.05 * near)

    def centred(self, query: Query, *, fused: bool) -> tuple[Rows, Floats]:
        """The dense leg over mean-centred vectors, alone or fused.

        The collection's mean chunk vector is taken from the query and every chunk, each then made unit
        length again: the anisotropy correction of Mu and Viswanath (2018).
        """
        if self._centred is None:
            mean = self.signals.chunk_vectors.mean(axis=0)
            centred = self.signals.chunk_vectors - mean
            self._centred = (mean, centred / np.linalg.norm(centred, axis=1, keepdims=True))
        mean, chunks = self._centred
        vector = query.vector - mean
        dense = (chunks @ (vector / np.linalg.norm(vector))).astype(np.float64)
        top = _top(dense, POOL, positive=False)
        if not fused:
            return top, dense[top]
        candidates = np.union1d(top, query.keyword_top)
        moved = Query(query.text, query.vector, dense, query.keyword, candidates, top, query.keyword_top)
        return candidates, self.today(moved)

    def character_grams(self, query: Query) -> Floats:
        """Every chunk's TF-IDF cosine over character 3- to 5-grams within words (title and text).

        A third lexical view beside BM25's stems: it matches inflections, compounds and the pieces of
        chemical and gene names that the tokenizer keeps whole. Built once (scikit-learn), sublinear TF.
        """
        if self._grams is None:
            from sklearn.feature_extraction.text import TfidfVectorizer  # type: ignore[import-untyped]

            vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, min_df=2)
            texts = [
                embedding_text(t, x) for t, x in zip(self.signals.titles, self.signals.texts, strict=True)
            ]
            self._grams = (vectorizer, vectorizer.fit_transform(texts).T.tocsr())
        vectorizer, chunks_by_gram = self._grams
        return np.asarray(
            (vectorizer.transform([query.text]) @ chunks_by_gram).toarray()[0], dtype=np.float64
        )

    def all(self) -> dict[str, Variant]:
        s, k = self, self.bm25
        three: dict[str, Variant] = {
            f"sentence leg: dense {d}, sentence {e}, BM25 {round(1 - d - e, 2)}": partial(
                s.sentence_leg, dense=d, sentence=e
            )
            for d in (0.2, 0.25, 0.3, 0.35)
            for e in (0.15, 0.25, 0.35)
        }
        return {
            "today": s.today,
            "dense alone": lambda q: q.dense[q.candidates],
            "BM25 alone": lambda q: q.keyword[q.candidates],
            "sentences alone (best sentence cosine)": lambda q: s.sentences(q)[q.candidates],
            **{f"today, dense weight {w}": partial(s.today, dense_weight=w) for w in (0.4, 0.6)},
            **three,
            "sentence leg: thirds": lambda q: fuse(
                q, [(1 / 3, q.dense, False), (1 / 3, s.sentences(q), False), (1 / 3, q.keyword, True)]
            ),
            "dense = max(chunk, best sentence)": lambda q: fuse(
                q,
                [
                    (0.5, np.maximum(q.dense, s.sentences(q)).astype(np.float64), False),
                    (0.5, q.keyword, True),
                ],
            ),
            "title leg: dense 0.4, title 0.2, BM25 0.4": lambda q: fuse(
                q,
                [
                    (0.4, q.dense, False),
                    (0.2, (s.signals.title_vectors @ q.vector).astype(np.float64), False),
                    (0.4, q.keyword, True),
                ],
            ),
            "sequential dependence: BM25 + 0.1 ordered pairs (window 2) + 0.05 unordered (window 8)": (
                s.sequential_dependence
            ),
            "BM25 k1 0.9, b 0.4 (Anserini's BEIR setting)": lambda q: s.with_keyword(
                q, k.scores(q.text, 0.9, 0.4)
            ),
            "score regularization: 0.2 towards the 5 nearest candidates": lambda q: s.smoothed(q, 0.2, 5),
            "score regularization: 0.3 towards the 10 nearest candidates": lambda q: s.smoothed(q, 0.3, 10),
            "legs weighted by their top's sharpness": lambda q: s.gap_weighted(q, 1.0),
            "dense alone, mean-centred vectors": partial(s.centred, fused=False),
            "today with the dense leg over mean-centred vectors": partial(s.centred, fused=True),
            "character 3-5-grams alone (TF-IDF cosine, today's candidates)": lambda q: s.character_grams(q)[
                q.candidates
            ],
            "character-gram leg: thirds": lambda q: fuse(
                q,
                [(1 / 3, q.dense, False), (1 / 3, s.character_grams(q), False), (1 / 3, q.keyword, True)],
            ),
            "character-gram leg: dense 0.4, character grams 0.2, BM25 0.4": lambda q: fuse(
                q, [(0.4, q.dense, False), (0.2, s.character_grams(q), False), (0.4, q.keyword, True)]
            ),
            "character grams in place of BM25 (today's candidates), 0.5 / 0.5": lambda q: fuse(
                q, [(0.5, q.dense, False), (0.5, s.character_grams(q), False)]
            ),
            "CombMNZ (today x legs that returned it)": lambda q: (
                s.today(q)
                * (np.isin(q.candidates, q.dense_top).astype(float) + np.isin(q.candidates, q.keyword_top))
            ),
        }


def _queries(signals: Signals, bm25: Bm25, queries: dict[str, str]) -> Iterator[tuple[str, Query]]:
    """Each query's two legs over every chunk, and their candidates."""
    for query_id, text in queries.items():
        vector = signals.query_vectors[signals.query_row[query_id]]
        dense = (signals.chunk_vectors @ vector).astype(np.float64)
        keyword = bm25.scores(text)
        dense_top, keyword_top = _top(dense, POOL, positive=False), _top(keyword, POOL, positive=True)
        candidates = np.union1d(dense_top, keyword_top)
        yield query_id, Query(text, vector, dense, keyword, candidates, dense_top, keyword_top)


def _documents(signals: Signals, candidates: Rows, scores: Floats) -> list[str]:
    """The candidates' documents, best first (a document at its best chunk; ties by chunk id), top 100."""
    order = candidates[np.lexsort((np.asarray(signals.chunk_ids)[candidates], -scores))]
    return list(dict.fromkeys(np.asarray(signals.document_ids)[order].tolist()))[:100]


def _measures(qrels: Qrels, rankings: dict[str, list[str]]) -> tuple[Floats, Floats]:
    """Each query's nDCG@10 and Recall@100, in qrels order (a query with no ranking: 0)."""
    measured = score_queries(qrels, rankings)
    ndcg = np.asarray([measured.get(q, {}).get("ndcg@10", 0.0) for q in qrels])
    return ndcg, np.asarray([measured.get(q, {}).get("recall@100", 0.0) for q in qrels])


def _ndcg(qrels: Qrels, rankings: dict[str, list[str]]) -> Floats:
    return _measures(qrels, rankings)[0]


def _paired(ndcg: Floats, baseline: Floats) -> dict[str, float]:
    difference = ndcg - baseline
    return {
        "ndcg@10": round(float(ndcg.mean()), 4),
        "ndcg@10_difference": round(float(difference.mean()), 4),
        "standard_error": round(float(difference.std(ddof=1) / np.sqrt(len(difference))), 4),
    }


FEATURES = (
    "dense min-max",
    "dense",
    "BM25 / best",
    "BM25",
    "best sentence min-max",
    "best sentence",
    "title min-max",
    "title",
    "log dense rank",
    "log BM25 rank",
    "first chunk",
    "chunk length",
)


def _features(variants: Variants, query: Query) -> npt.NDArray[np.float64]:
    """One row of FEATURES per candidate."""
    rows = query.candidates
    sentence = variants.sentences(query)[rows]
    title = (variants.signals.title_vectors[rows] @ query.vector).astype(np.float64)
    keyword = query.keyword[rows]
    best = float(keyword.max())
    first = np.asarray([variants.signals.chunk_ids[r].endswith("#0") for r in rows], dtype=np.float64)
    return np.column_stack(
        [
            _min_max(query.dense[rows]),
            query.dense[rows],
            keyword / best if best > 0 else keyword,
            keyword,
            _min_max(sentence),
            sentence,
            _min_max(title),
            title,
            np.log1p(np.argsort(np.argsort(-query.dense[rows]))),
            np.log1p(np.argsort(np.argsort(-keyword))),
            first,
            variants.bm25.lengths[rows],
        ]
    )


@dataclass
class _Learned:
    """One query's candidates, their features and labels, and today's fused scores."""

    query_id: str
    candidates: Rows
    features: npt.NDArray[np.float64]
    relevant: npt.NDArray[np.int64]
    today: Floats


def _learning_data(signals: Signals, bm25: Bm25, qrels: Qrels) -> list[_Learned]:
    variants = Variants(signals, bm25)
    data = []
    for query_id, query in _queries(signals, bm25, {q: signals.queries[q] for q in qrels}):
        documents = np.asarray(signals.document_ids)[query.candidates]
        relevant = np.asarray([qrels[query_id].get(d, 0) > 0 for d in documents], dtype=np.int64)
        data.append(
            _Learned(query_id, query.candidates, _features(variants, query), relevant, variants.today(query))
        )
    return data


LEARNERS: dict[str, dict[str, Any]] = {
    "15 leaves, 100 rounds, rate 0.05": {"max_leaf_nodes": 15, "max_iter": 100, "learning_rate": 0.05},
    "7 leaves, 200 rounds, rate 0.03, L2 1": {
        "max_leaf_nodes": 7,
        "max_iter": 200,
        "learning_rate": 0.03,
        "l2_regularization": 1.0,
    },
}
"""learn: scikit-learn HistGradientBoostingClassifier settings tried (5-fold cross-validation on train)."""


def learn(signals: Signals, dataset: Path, test: bool) -> dict[str, Any]:
    """A gradient-boosted ranker over FEATURES (label: the candidate's document is relevant), against today.

    Cross-validated by query on train (5 folds: each fold's model ranks only its held-out queries); with
    `test`, the best setting on train is fitted on all of train and ranks test.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier  # type: ignore[import-untyped]

    bm25 = Bm25(signals.titles, signals.texts)
    train_qrels = load_beir(dataset, "train").qrels
    train = _learning_data(signals, bm25, train_qrels)
    folds = np.random.default_rng(0).integers(0, 5, len(train))

    def ranked(data: list[_Learned], scores: list[Floats]) -> dict[str, list[str]]:
        return {d.query_id: _documents(signals, d.candidates, s) for d, s in zip(data, scores, strict=True)}

    def fitted(data: list[_Learned], settings: dict[str, Any]) -> Any:
        model = HistGradientBoostingClassifier(random_state=0, **settings)
        return model.fit(np.vstack([d.features for d in data]), np.concatenate([d.relevant for d in data]))

    baseline = _ndcg(train_qrels, ranked(train, [d.today for d in train]))
    report: dict[str, Any] = {"features": list(FEATURES), "train_today": round(float(baseline.mean()), 4)}
    cross_validated: dict[str, dict[str, float]] = {}
    for name, settings in LEARNERS.items():
        scores: list[Floats] = [np.zeros(0)] * len(train)
        for fold in range(5):
            model = fitted([d for d, f in zip(train, folds, strict=True) if f != fold], settings)
            for index in np.flatnonzero(folds == fold):
                scores[index] = model.predict_proba(train[index].features)[:, 1]
        cross_validated[name] = _paired(_ndcg(train_qrels, ranked(train, scores)), baseline)
        print(f"train (5-fold CV) {name}: {cross_validated[name]}", file=sys.stderr)
    report["train_cross_validated"] = cross_validated
    if test:
        best = max(cross_validated, key=lambda n: cross_validated[n]["ndcg@10"])
        test_qrels = load_beir(dataset, "test").qrels
        held_out = _learning_data(signals, bm25, test_qrels)
        model = fitted(train, LEARNERS[best])
        today = _ndcg(test_qrels, ranked(held_out, [d.today for d in held_out]))
        learned = _ndcg(
            test_qrels, ranked(held_out, [model.predict_proba(d.features)[:, 1] for d in held_out])
        )
        report["test"] = {"setting": best, "today": round(float(today.mean()), 4), **_paired(learned, today)}
        print(f"test {best}: {report['test']}", file=sys.stderr)
    return report


QUERY_FEATURES = (
    "mean IDF of the query's stems",
    "highest IDF",
    "stems not in the collection",
    "stems",
    "words",
    "dense: best cosine",
    "dense: best - 10th",
    "dense: spread of the top 10",
    "dense: spread / mean of the top 100 (NQC)",
    "dense: best - 100th",
    "BM25: best",
    "BM25: (best - 10th) / best",
    "BM25: spread / mean of the top 100 (NQC)",
    "BM25: chunks returned",
    "documents in both legs' top 10 / 10",
    "both legs' best chunk the same",
    "dense's best document in BM25's top 10",
    "BM25's best document in dense's top 10",
)
"""adapt: what a query-performance predictor reads of one query and its two legs, before fusing."""

WEIGHTS = np.round(np.arange(0, 1.01, 0.1), 1)
"""adapt: the dense weights a query may get (today: 0.5)."""


def _query_features(signals: Signals, bm25: Bm25, query: Query) -> list[float]:
    stems = bm25.stems(query.text)
    idfs = [bm25.idf(len(bm25.postings[s][0])) for s in stems if s in bm25.postings] or [0.0]
    dense = np.sort(query.dense[query.dense_top])[::-1]
    keyword = np.pad(np.sort(query.keyword[query.keyword_top])[::-1], (0, POOL))[:POOL]
    documents = np.asarray(signals.document_ids)
    dense_ten, keyword_ten = set(documents[query.dense_top[:10]]), set(documents[query.keyword_top[:10]])
    found = len(query.keyword_top) > 0
    return [
        float(np.mean(idfs)),
        float(np.max(idfs)),
        float(sum(s not in bm25.postings for s in stems)),
        float(len(stems)),
        float(len(query.text.split())),
        float(dense[0]),
        float(dense[0] - dense[9]),
        float(dense[:10].std()),
        float(dense.std() / max(float(dense.mean()), 1e-6)),
        float(dense[0] - dense[-1]),
        float(keyword[0]),
        float((keyword[0] - keyword[9]) / (keyword[0] + 1e-9)),
        float(keyword.std() / (keyword.mean() + 1e-9)),
        float(len(query.keyword_top)),
        len(dense_ten & keyword_ten) / 10,
        float(found and query.dense_top[0] == query.keyword_top[0]),
        float(documents[query.dense_top[0]] in keyword_ten),
        float(found and documents[query.keyword_top[0]] in dense_ten),
    ]


def _weight_data(signals: Signals, bm25: Bm25, qrels: Qrels) -> tuple[npt.NDArray[np.float64], Floats]:
    """Each query's QUERY_FEATURES, and its nDCG@10 at every dense weight in WEIGHTS (queries x weights)."""
    variants = Variants(signals, bm25)
    features: dict[str, list[float]] = {}
    rankings: list[dict[str, list[str]]] = [{} for _ in WEIGHTS]
    for query_id, query in _queries(signals, bm25, {q: signals.queries[q] for q in qrels}):
        features[query_id] = _query_features(signals, bm25, query)
        for column, weight in enumerate(WEIGHTS):
            rankings[column][query_id] = _documents(signals, query.candidates, variants.today(query, weight))
    ndcg = np.column_stack([_ndcg(qrels, ranking) for ranking in rankings])
    return np.asarray([features.get(q, [0.0] * len(QUERY_FEATURES)) for q in qrels]), ndcg


TODAY = int(np.flatnonzero(WEIGHTS == 0.5)[0])
OFFERED = {"every weight 0-1": tuple(range(len(WEIGHTS))), "0.3, 0.5, 0.7": (3, 5, 7), "0.4-0.6": (4, 5, 6)}
"""adapt: the sets of WEIGHTS columns a query may be moved to."""
MEAN = "ndcg@10_difference (mean of 4 splits)"
Regressor = Callable[[], Any]


def _regressors() -> dict[str, Regressor]:
    """adapt: the regressors tried for each weight's gain over today's (scikit-learn: a dev dependency)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import Ridge  # type: ignore[import-untyped]
    from sklearn.pipeline import make_pipeline  # type: ignore[import-untyped]
    from sklearn.preprocessing import StandardScaler  # type: ignore[import-untyped]

    return {
        "ridge, alpha 1": lambda: make_pipeline(StandardScaler(), Ridge(1.0)),
        "ridge, alpha 100": lambda: make_pipeline(StandardScaler(), Ridge(100.0)),
        "gradient-boosted, 7 leaves, 100 rounds, rate 0.05": lambda: HistGradientBoostingRegressor(
            max_leaf_nodes=7, max_iter=100, learning_rate=0.05, min_samples_leaf=40, random_state=0
        ),
    }


def _chosen_weights(
    setting: tuple[Regressor, tuple[int, ...], float],
    features: npt.NDArray[np.float64],
    ndcg: Floats,
    held_out: npt.NDArray[np.float64],
) -> Rows:
    """Each held-out query's WEIGHTS column: the offered one whose predicted gain over today's is highest,
    today's unless that gain exceeds the setting's margin."""
    make, offered, margin = setting
    predicted = np.column_stack(
        [make().fit(features, ndcg[:, c] - ndcg[:, TODAY]).predict(held_out) for c in offered]
    )
    picked: Rows = np.asarray(offered, dtype=np.intp)[np.argmax(predicted, axis=1)]
    picked[predicted.max(axis=1) <= margin] = TODAY
    return picked


def adapt(signals: Signals, dataset: Path, test: bool) -> dict[str, Any]:
    """Query-dependent fusion weights: a regressor per dense weight predicts, from QUERY_FEATURES, how much
    better than today's 0.5 that weight ranks the query; the query gets the best predicted weight.

    Every setting (regressor x weights offered x margin) is cross-validated by query on train (5 folds,
    4 different splits, averaged); with `test`, the best is fitted on all of train and run on test once.
    """
    from sklearn.model_selection import KFold  # type: ignore[import-untyped]

    settings = {
        f"{name}; weights {offered}; margin {margin}": (make, columns, margin)
        for (name, make), (offered, columns), margin in itertools.product(
            _regressors().items(), OFFERED.items(), (0.0, 0.01)
        )
    }
    bm25 = Bm25(signals.titles, signals.texts)
    features, ndcg = _weight_data(signals, bm25, load_beir(dataset, "train").qrels)
    train: dict[str, Any] = {
        "today": round(float(ndcg[:, TODAY].mean()), 4),
        "each weight": {str(w): round(float(ndcg[:, c].mean()), 4) for c, w in enumerate(WEIGHTS)},
        "oracle (best weight per query)": round(float(ndcg.max(axis=1).mean()), 4),
        "cross_validated": {},
    }
    for key, setting in settings.items():
        runs = []
        for seed in range(4):
            picked = np.zeros(len(ndcg), dtype=np.intp)
            for fitting, held in KFold(5, shuffle=True, random_state=seed).split(features):
                picked[held] = _chosen_weights(setting, features[fitting], ndcg[fitting], features[held])
            runs.append(_paired(ndcg[np.arange(len(ndcg)), picked], ndcg[:, TODAY]))
        mean = round(float(np.mean([r["ndcg@10_difference"] for r in runs])), 4)
        train["cross_validated"][key] = {MEAN: mean, "splits": runs}
        print(f"train (5-fold CV x 4) {key}: {mean:+.4f}", file=sys.stderr)
    report: dict[str, Any] = {"features": list(QUERY_FEATURES), "train": train}
    if test:
        best = max(settings, key=lambda k: float(train["cross_validated"][k][MEAN]))
        held_features, held_ndcg = _weight_data(signals, bm25, load_beir(dataset, "test").qrels)
        picked = _chosen_weights(settings[best], features, ndcg, held_features)
        report["test"] = {
            "setting": best,
            "today": round(float(held_ndcg[:, TODAY].mean()), 4),
            "oracle (best weight per query)": round(float(held_ndcg.max(axis=1).mean()), 4),
            "queries moved off 0.5": round(float(np.mean(picked != TODAY)), 2),
            **_paired(held_ndcg[np.arange(len(held_ndcg)), picked], held_ndcg[:, TODAY]),
        }
        print(f"test {best}: {report['test']}", file=sys.stderr)
    return report


def score(signals: Signals, dataset: Path, split: str, only: list[str] | None) -> dict[str, Any]:
    """Every variant's nDCG@10 and Recall@100 on the split, each paired against today's."""
    qrels = load_beir(dataset, split).qrels
    queries = {q: signals.queries[q] for q in qrels}
    bm25 = Bm25(signals.titles, signals.texts)
    variants = Variants(signals, bm25).all()
    chosen = {name: variants[name] for name in (only or list(variants)) if name in variants}
    chosen = {"today": variants["today"], **chosen}
    rankings: dict[str, dict[str, list[str]]] = {name: {} for name in chosen}
    for query_id, query in _queries(signals, bm25, queries):
        for name, variant in chosen.items():
            result = variant(query)
            candidates, scores = result if isinstance(result, tuple) else (query.candidates, result)
            rankings[name][query_id] = _documents(signals, candidates, scores)
    report: dict[str, Any] = {}
    baseline: Floats | None = None
    per_query: dict[str, Floats] = {}
    for name, ranking in rankings.items():
        ndcg, recall = _measures(qrels, ranking)
        baseline = ndcg if baseline is None else baseline
        per_query[name] = ndcg
        paired = _paired(ndcg, baseline)
        report[name] = {"recall@100": round(float(recall.mean()), 4), **paired}
        print(
            f"{split:5} {name[:70]:70} nDCG@10 {ndcg.mean():.4f} R@100 {recall.mean():.4f}"
            f"  {paired['ndcg@10_difference']:+.4f} ± {paired['standard_error']:.4f}",
            file=sys.stderr,
        )
    # Headroom: each query ranked by whichever of these does best on it (an oracle: no method can choose so).
    single = [
        n
        for n in ("today", "dense alone", "BM25 alone", "sentences alone (best sentence cosine)")
        if n in per_query
    ]
    oracle = float(np.max(np.stack([per_query[n] for n in single]), axis=0).mean())
    print(f"{split:5} {'per-query best of ' + ', '.join(single):70} nDCG@10 {oracle:.4f}", file=sys.stderr)
    return {
        "split": split,
        "queries": len(qrels),
        "pool": POOL,
        "variants": report,
        "oracle": {"of": single, "ndcg@10": round(oracle, 4)},
    }


def main(argv: list[str] | None = None) -> int:
    limit_blas_threads()
    parser = argparse.ArgumentParser(
        prog="python -m bench.quality_signals", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    e = commands.add_parser("encode", help="read the build's chunks, embed queries, sentences and titles")
    e.add_argument("--dataset", type=Path, required=True)
    e.add_argument("--collection", default="eval-scifact")
    e.add_argument("--out", type=Path, required=True)
    s = commands.add_parser("score", help="every variant on one split")
    s.add_argument("signals", type=Path)
    s.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    s.add_argument("--split", default="train")
    s.add_argument("--only", help="variant names, separated by ';' (today is always scored)")
    s.add_argument("--json", type=Path, help="write the report here")
    n = commands.add_parser("learn", help="a gradient-boosted ranker over every signal, against today")
    n.add_argument("signals", type=Path)
    n.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    n.add_argument("--test", action="store_true", help="also fit on all of train and rank test")
    n.add_argument("--json", type=Path, help="write the report here")
    a = commands.add_parser("adapt", help="query-dependent fusion weights from query-performance predictors")
    a.add_argument("signals", type=Path)
    a.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    a.add_argument("--test", action="store_true", help="also fit on all of train and run test")
    a.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.command in ("learn", "adapt"):
        run = learn if args.command == "learn" else adapt
        learned = run(Signals(**pickle.loads(args.signals.read_bytes())), args.dataset, args.test)
        if args.json:
            args.json.write_text(json.dumps(learned, indent=2))
        return 0
    if args.command == "encode":
        signals = encode(Settings().data_dir, args.dataset, args.collection)
        args.out.write_bytes(pickle.dumps(signals.fields()))
        return 0
    signals = Signals(**pickle.loads(args.signals.read_bytes()))
    report = score(signals, args.dataset, args.split, args.only.split(";") if args.only else None)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

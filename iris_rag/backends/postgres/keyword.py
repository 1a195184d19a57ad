"""Terms exactly as SQLite FTS5's `porter unicode61` tokenizer indexes them, and BM25's constants.

The Postgres keyword index stores these terms per chunk, so its BM25 (computed in SQL from the
collection's own counts) matches the SQLite store's FTS5 bm25 (k1 1.2, b 0.75). The tokenizer is FTS5's
own, run on an in-memory SQLite table: a re-implementation (unicode61 rules, snowballstemmer's porter)
differed on about 0.4% of SciFact's words (FTS5's porter maps 'logi' -> 'log' and 'bli' -> 'ble'; unicode61
folds the micro sign to Greek mu).
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter

K1 = 1.2
B = 0.75

_local = threading.local()


def _tokenizer() -> sqlite3.Connection:
    connection: sqlite3.Connection | None = getattr(_local, "connection", None)
    if connection is None:
        connection = sqlite3.connect(":memory:", isolation_level=None)
        connection.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize = 'porter unicode61')")
        connection.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        _local.connection = connection
    return connection


def tokenize(texts: list[str]) -> list[list[str]]:
    """Each text's stemmed tokens, in order, as FTS5 `porter unicode61` indexes them."""
    if not texts:
        return []
    connection = _tokenizer()
    found: list[list[tuple[int, str]]] = [[] for _ in texts]
    connection.execute("BEGIN")
    try:
        connection.executemany("INSERT INTO t (rowid, x) VALUES (?, ?)", enumerate(texts))
        for term, row, offset in connection.execute("SELECT term, doc, offset FROM v"):
            found[row].append((offset, term))
    finally:
        connection.execute("ROLLBACK")
    return [[term for _, term in sorted(tokens)] for tokens in found]


def tokens(text: str) -> list[str]:
    """The stemmed tokens of one text, in order."""
    return tokenize([text])[0]


def term_frequencies(texts: list[str]) -> list[tuple[Counter[str], int]]:
    """Each text's stemmed terms with their counts, and its length in tokens."""
    return [(Counter(found), len(found)) for found in tokenize(texts)]


def query_stems(terms: dict[str, int]) -> dict[str, int]:
    """Query terms (with weights) as indexed stems with weights; a stem reached twice counts twice.

    A term that tokenizes to several tokens adds each of them (FTS5 would require them adjacent: rare
    for terms cut from a query at word boundaries).
    """
    weights: Counter[str] = Counter()
    for weight, found in zip(terms.values(), tokenize(list(terms)), strict=True):
        for token in found:
            weights[token] += weight
    return dict(weights)

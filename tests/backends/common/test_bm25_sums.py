"""BM25 sums per chunk: the dense (row range) and sparse (sorted rows) ways give the same numbers."""

from __future__ import annotations

import numpy as np
import pytest

from iris_rag.backends.common import bm25
from iris_rag.backends.common.bm25 import PartialParts, Postings, TermCounts, Totals, bm25_parts, bm25_scores


def _postings(rng: np.random.Generator, rows: np.ndarray, terms: int) -> Postings:
    """Every row holding a random subset of the terms, counts and lengths at random."""
    term, chunk_row = [], []
    for t in range(terms):
        held = rows[rng.random(len(rows)) < 0.3 / (t + 1)]
        if t == 3:  # the middle third only
            held = held[(held > rows[len(rows) // 3]) & (held < rows[2 * len(rows) // 3])]
        term.append(np.full(len(held), t))
        chunk_row.append(held)
    n = sum(len(c) for c in chunk_row)

    def tf() -> np.ndarray:
        return rng.integers(0, 4, n).astype(np.float64)

    return Postings(
        term=np.concatenate(term).astype(np.int64),
        chunk_row=np.concatenate(chunk_row).astype(np.int64),
        title_tf=tf(),
        content_tf=tf() + 1,
        title_length=rng.integers(1, 20, n).astype(np.float64),
        content_length=rng.integers(20, 300, n).astype(np.float64),
    )


@pytest.mark.parametrize("scoring", ["flat", "multifield"])
@pytest.mark.parametrize("spread", [1, 1_000], ids=["dense rows", "rows spread among others"])
def test_term_at_a_time_sums_equal_one_pass(
    scoring: str, spread: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    rows = 10_000 + spread * np.arange(3_000, dtype=np.int64)
    postings = _postings(rng, rows, 6)
    weights = np.array([1.0, 2.0, 1.0, 1.0, 0.5, 1.0])
    totals = Totals(chunks=3_000, titled_chunks=2_500, title_tokens=25_000, content_tokens=400_000)
    counts = TermCounts(
        *(
            np.bincount(postings.term[mask], minlength=6).astype(np.float64)
            for mask in (np.ones(len(postings.term), bool), postings.title_tf > 0, postings.content_tf > 0)
        )
    )
    one_pass = bm25_parts(postings, weights, totals, scoring, 2.0, counts)
    parts = PartialParts(totals.chunks)
    # Rarest first, as MaxScore reads them; then a term held by the middle rows only, then the rest:
    # the range held grows on both sides.
    for t in (3, 5, 1, 0, 2, 4):
        keep = postings.term == t
        term_only = Postings(*(getattr(postings, f)[keep] for f in Postings.__dataclass_fields__))
        parts.add(*bm25_parts(term_only, weights, totals, scoring, 2.0, counts))
    got = parts.arrays()
    assert (parts._sparse is not None) == (spread > 1)  # the way taken is the point
    assert np.array_equal(got[0], one_pass[0])
    np.testing.assert_allclose(got[1], one_pass[1], rtol=1e-12)
    np.testing.assert_allclose(got[2], one_pass[2], rtol=1e-12)
    # The one-pass scores do not depend on which way the chunks were summed.
    dense = bm25_scores(postings, weights, totals, scoring, 2.0)
    monkeypatch.setattr(bm25, "DENSE_SPAN_PER_POSTING", 0)
    sparse = bm25_scores(postings, weights, totals, scoring, 2.0)
    assert np.array_equal(dense[0], sparse[0]) and np.array_equal(dense[1], sparse[1])

"""Versions that append to shared storage (appended.py) each read only what they were made with."""

from __future__ import annotations

import random

import numpy as np
import pytest

from iris_rag.backends.sqlite import postings
from iris_rag.backends.sqlite.postings import KeywordPostings, PostingRow, encode
from iris_rag.stores import appended
from iris_rag.stores.appended import Column

TERMS = 12


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Little spare room and a small delta, so a short test grows the columns and compacts often."""
    monkeypatch.setattr(appended, "MIN_SPARE", 2)
    monkeypatch.setattr(postings, "MIN_DELTA_POSTINGS", 40)


@pytest.mark.usefixtures("small")
def test_a_column_appends_in_place_only_for_its_newest_version() -> None:
    first, values = Column(np.arange(3)).extended(3, np.array([3, 4]))
    second, more = first.extended(5, np.array([5]))
    assert second is first  # the newest version's room is used
    branch, other = first.extended(5, np.array([9, 9]))  # a second version made from the same one
    assert branch is not first
    assert values.tolist() == [0, 1, 2, 3, 4]
    assert more.tolist() == [0, 1, 2, 3, 4, 5]
    assert other.tolist() == [0, 1, 2, 3, 4, 9, 9]
    same, unchanged = first.extended(6, np.array([], dtype=np.int64))
    assert same is first and unchanged.tolist() == more.tolist()


def _rows(rng: random.Random, document: str, chunks: int, rowid: int) -> list[PostingRow]:
    return [
        (
            rowid + i,
            f"{document}#{i}",
            document,
            encode({t: (rng.randint(0, 2), rng.randint(1, 5)) for t in rng.sample(range(TERMS), 4)}),
        )
        for i in range(chunks)
    ]


PHRASES: list[list[int | None]] = [[0], [1, 5], [2, 7, 11], [3, 3, 9], [10, None, 4]]


def _rankings(version: KeywordPostings) -> list[list[tuple[str, float]] | None]:
    return [version.score(phrases, 2.0, 50) for phrases in PHRASES]


@pytest.mark.usefixtures("small")
def test_postings_versions_score_as_a_fresh_load_through_replacements_and_branches() -> None:
    """Each version ranks as its own rows loaded afresh would, and keeps doing so after later versions
    appended to the storage it shares, including versions made again from an older one."""
    rng = random.Random(5)
    rowid = 0
    rows: dict[str, list[PostingRow]] = {}
    for d in range(8):
        rows[f"d{d}"] = _rows(rng, f"d{d}", 2, rowid)
        rowid += 2
    version = KeywordPostings.load([[row for chunks in rows.values() for row in chunks]])
    held: list[tuple[KeywordPostings, dict[str, list[PostingRow]]]] = [(version, dict(rows))]
    for step in range(150):
        if step % 10 == 9:  # a version made from an older one, as if written again from there
            version, rows = rng.choice(held)
            rows = dict(rows)
        documents = {f"d{rng.randint(0, 12)}" for _ in range(rng.randint(1, 2))}
        written: list[PostingRow] = []
        for document in sorted(documents):
            rows.pop(document, None)
            if rng.random() < 0.8:
                rows[document] = _rows(rng, document, rng.randint(1, 3), rowid)
                rowid += len(rows[document])
                written += rows[document]
        version = version.replaced(documents, written)
        held.append((version, dict(rows)))
    expected = [
        _rankings(KeywordPostings.load([sorted((r for c in live.values() for r in c), key=lambda r: r[0])]))
        for _, live in held
    ]
    assert [_rankings(version) for version, _ in held] == expected
    assert any(not version.deltas for version, _ in held[1:])  # it did compact
    assert any(len(version.deltas) > 2 for version, _ in held)  # and merged deltas in tiers

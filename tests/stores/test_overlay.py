"""The matrix's lookups are shared between versions (Overlay): each version reads as a dict of its own."""

from __future__ import annotations

import random

import numpy as np
import pytest

from iris_rag.backends.sqlite import overlay
from iris_rag.backends.sqlite.overlay import Overlay
from iris_rag.backends.sqlite.vectors import Batch, VectorMatrix


@pytest.fixture
def small_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fold the changes into a new base after a few of them, so a short test crosses many folds."""
    monkeypatch.setattr(overlay, "MIN_CHANGES", 5)
    monkeypatch.setattr(overlay, "CHANGES_PER_SQRT", 1)


@pytest.mark.usefixtures("small_folds")
def test_every_version_reads_as_the_dict_it_was_made_from() -> None:
    rng = random.Random(7)
    model = {f"k{i}": i for i in range(40)}
    current: Overlay[str, int] = Overlay(dict(model))
    versions: list[tuple[Overlay[str, int], dict[str, int]]] = [(current, dict(model))]
    for step in range(300):
        removed = rng.sample([*sorted(model), "absent"], rng.randint(0, 3))
        added = [(f"k{rng.randint(0, 80)}", step) for _ in range(rng.randint(0, 3))]
        current = current.changed(removed, added)
        for key in removed:
            model.pop(key, None)
        model.update(added)
        versions.append((current, dict(model)))
    for version, expected in versions:  # the old ones too: a later change never reached them
        assert dict(version) == expected
        assert len(version) == len(expected)
        assert all(key in version and version[key] == value for key, value in expected.items())
        assert "absent" not in version and "k999" not in version
        with pytest.raises(KeyError):
            version["k999"]
    assert any(not v._changes for v, _ in versions[1:])  # it did fold


def _batch(document: str, chunks: int, seed: int) -> Batch:
    vectors = np.random.default_rng(seed).normal(size=(chunks, 4)).astype(np.float32)
    return [f"{document}#{i}" for i in range(chunks)], [document] * chunks, [row.tobytes() for row in vectors]


def _lookups_of(matrix: VectorMatrix) -> tuple[dict[str, int], dict[str, list[int]]]:
    """What a fresh index of the version's live rows holds."""
    live = sorted(set(range(matrix.size)) - set(matrix.dead.tolist()))
    rows_of_document: dict[str, list[int]] = {}
    for row in live:
        rows_of_document.setdefault(matrix.document_ids[row], []).append(row)
    return {matrix.chunk_ids[row]: row for row in live}, rows_of_document


@pytest.mark.usefixtures("small_folds")
def test_matrix_versions_keep_their_lookups_through_replacements_and_compactions() -> None:
    rng = random.Random(3)
    matrix = VectorMatrix.load([_batch(f"d{i}", 3, i) for i in range(30)], 90, min_rows=0)
    held: list[tuple[VectorMatrix, dict[str, int], dict[str, list[int]]]] = []
    for step in range(120):
        documents = {f"d{rng.randint(0, 40)}" for _ in range(rng.randint(1, 3))}
        batches = [_batch(d, rng.randint(0, 4), step) for d in sorted(documents) if rng.random() < 0.8]
        matrix = matrix.replaced(documents, batches, min_rows=0)
        row_of, rows_of_document = _lookups_of(matrix)
        assert dict(matrix.row_of) == row_of
        assert {d: list(r) for d, r in matrix.rows_of_document.items()} == rows_of_document
        assert matrix.live_count == len(row_of)
        held.append((matrix, row_of, rows_of_document))
    for version, row_of, rows_of_document in held:  # every older version still reads what it read
        assert dict(version.row_of) == row_of
        assert {d: list(r) for d, r in version.rows_of_document.items()} == rows_of_document
        assert [version.chunk_ids[row] for row in row_of.values()] == list(row_of)

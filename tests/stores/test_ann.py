"""The SQLite store's inverted file: approximate top-k for large collections, exact otherwise.

The threshold (vectors.ANN_MIN_ROWS, 20K live rows) is lowered to 1,000 here so that a small clustered
collection takes the approximate path. Two stores on one file stand for two processes, as in
test_vector_updates: the reader's inverted file must follow the writer's changes without a reload.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from pydantic import ValidationError

from iris_rag.backends import create_store
from iris_rag.backends.sqlite import vectors
from iris_rag.backends.sqlite.store import SqliteStore
from iris_rag.settings import Settings
from iris_rag.stores.base import ChunkInput, DocumentInput
from iris_rag.stores.filters import parse_filters

DIM = 24
CLUSTERS = 60
DOCUMENTS = 1_500  # two chunks each: 3,000 rows
THRESHOLD = 1_000


def clustered(count: int, seed: int) -> npt.NDArray[np.float32]:
    """Unit rows around CLUSTERS fixed centres, as embeddings of a corpus on a few topics are."""
    centres = np.random.default_rng(0).normal(size=(CLUSTERS, DIM))
    rng = np.random.default_rng(seed)
    rows = centres[rng.integers(0, CLUSTERS, count)] + rng.normal(size=(count, DIM)) * 0.6
    unit: npt.NDArray[np.float32] = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    return unit


def document(doc_id: str, rows: npt.NDArray[np.float32], group: int) -> DocumentInput:
    chunks = [ChunkInput(i, f"{doc_id} part {i}", 0, 1, row) for i, row in enumerate(rows)]
    return DocumentInput(doc_id, "", f"{doc_id} text", {"group": group}, chunks)


@pytest.fixture
def ann(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors, "ANN_MIN_ROWS", THRESHOLD)


@pytest.fixture
def pair(tmp_path: Path, ann: None) -> Iterator[tuple[SqliteStore, SqliteStore]]:
    """A reader with its matrix loaded (and lists trained) and a writer, on one 3,000-row collection."""
    path = tmp_path / "iris_rag.sqlite3"  # Settings.database_path under RAG_DATA_DIR=tmp_path
    writer = SqliteStore(path)
    writer.create_collection("c", "model", DIM)
    rows = clustered(2 * DOCUMENTS, seed=1)
    writer.upsert_documents(
        "c", [document(f"d{i}", rows[2 * i : 2 * i + 2], i % 5) for i in range(DOCUMENTS)]
    )
    reader = SqliteStore(path)
    reader.vector_search("c", rows[0], 5)
    yield reader, writer
    reader.close()
    writer.close()


def exact_top(store: SqliteStore, query: npt.NDArray[np.float32], k: int) -> list[str]:
    matrix = store._vector_index("c")
    scores = matrix.scores(query)
    return [matrix.chunk_ids[i] for i in np.argsort(-scores, kind="stable")[:k]]


def recall_at_10(store: SqliteStore, queries: npt.NDArray[np.float32]) -> float:
    found = []
    for query in queries:
        hits = {hit.chunk_id for hit in store.vector_search("c", query, 10)}
        found.append(len(hits & set(exact_top(store, query, 10))) / 10)
    return float(np.mean(found))


def test_a_large_collection_is_searched_through_its_lists_with_high_recall(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    reader, _ = pair
    matrix = reader._vector_index("c")
    assert matrix.inverted is not None
    assert matrix.inverted.lists == int(np.sqrt(2 * DOCUMENTS))
    queries = clustered(50, seed=2)
    probed, _ = matrix.approximate_top(queries[0], 10) or (np.zeros(0), None)
    assert 0 < probed.size < matrix.live_count  # only some lists are scored
    assert recall_at_10(reader, queries) >= 0.95
    # Scores are exact cosines, best first, whatever was probed.
    hits = reader.vector_search("c", queries[0], 10)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert reader.vector_scores("c", queries[0], [h.chunk_id for h in hits]) == pytest.approx(
        {h.chunk_id: h.score for h in hits}, abs=1e-5
    )


def test_below_the_threshold_and_under_a_filter_the_search_is_exact(
    pair: tuple[SqliteStore, SqliteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, _ = pair
    query = clustered(1, seed=3)[0]
    group = parse_filters({"group": 2})
    assert group is not None
    allowed = {f"d{i}#{c}" for i in range(2, DOCUMENTS, 5) for c in range(2)}
    expected = [chunk for chunk in exact_top(reader, query, 2 * DOCUMENTS) if chunk in allowed][:10]
    assert [h.chunk_id for h in reader.vector_search("c", query, 10, group)] == expected
    monkeypatch.setattr(vectors, "ANN_MIN_ROWS", 2 * DOCUMENTS + 1)
    assert [h.chunk_id for h in reader.vector_search("c", query, 10)] == exact_top(reader, query, 10)


def test_the_lists_follow_another_process_writes(pair: tuple[SqliteStore, SqliteStore]) -> None:
    reader, writer = pair
    trained = reader._vector_index("c").inverted
    fresh = clustered(20, seed=4)
    for number, row in enumerate(fresh):  # a new document whose chunk is exactly the query
        writer.upsert_documents("c", [document(f"new{number}", row[None, :], 0)])
        assert reader.vector_search("c", row, 1)[0].chunk_id == f"new{number}#0"
    matrix = reader._vector_index("c")
    assert matrix.inverted is trained  # appended to, not retrained
    assert int(reader.stats()["vector_rows_read"]) == 2 * DOCUMENTS + len(fresh)
    # Deleted documents leave no trace in the probed lists; a replaced one is found at its new place.
    for number in range(0, 20, 2):
        writer.delete_document("c", f"new{number}")
    writer.upsert_documents("c", [document("new1", fresh[3][None, :], 0)])
    for number in range(0, 20, 2):
        assert f"new{number}#0" not in {h.chunk_id for h in reader.vector_search("c", fresh[number], 10)}
    assert {h.chunk_id for h in reader.vector_search("c", fresh[3], 2)} == {"new1#0", "new3#0"}
    assert reader.vector_search("c", fresh[1], 1)[0].chunk_id != "new1#0"


def test_compaction_keeps_the_lists_and_growth_retrains_them(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    reader, writer = pair
    trained = reader._vector_index("c").inverted
    assert trained is not None
    # Replace most documents: the dead rows pass a quarter, so the matrix compacts in memory.
    rows = clustered(2 * DOCUMENTS, seed=5)
    replaced = DOCUMENTS // 2 + 100
    writer.upsert_documents("c", [document(f"d{i}", rows[2 * i : 2 * i + 2], i % 5) for i in range(replaced)])
    matrix = reader._vector_index("c")
    assert matrix.dead.size == 0 and matrix.inverted is not None
    assert matrix.inverted.centroids is trained.centroids
    assert recall_at_10(reader, clustered(30, seed=6)) >= 0.95
    # More than double the rows the lists were trained on: trained again on all of them.
    more = clustered(2 * DOCUMENTS + 200, seed=7)
    writer.upsert_documents(
        "c", [document(f"m{i}", more[2 * i : 2 * i + 2], 0) for i in range(len(more) // 2)]
    )
    grown = reader._vector_index("c")
    assert grown.inverted is not None and grown.inverted.trained_rows == grown.live_count
    assert recall_at_10(reader, clustered(30, seed=8)) >= 0.95


def test_the_settings_choose_the_threshold_and_the_probed_share(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    """SQLITE_ANN_MIN_CHUNKS=0: always exact, past the threshold too; SQLITE_ANN_PROBE_SHARE: lists probed."""
    reader, _ = pair
    assert reader._vector_index("c").inverted is not None  # 3,000 rows: approximate by default here
    rng = np.random.default_rng(6)
    queries = rng.normal(size=(50, DIM)).astype(np.float32)  # directions between the clusters
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    exact = [exact_top(reader, q, 10) for q in queries]
    narrow = SqliteStore(reader.path, ann_probe_share=0.01)  # MIN_PROBES (8) of the 54 lists
    try:
        approximate = [[h.chunk_id for h in narrow.vector_search("c", q, 10)] for q in queries]
    finally:
        narrow.close()
    assert approximate != exact  # some query misses a neighbour through the lists (else this proves nothing)
    settings = Settings(RAG_STORE="sqlite", RAG_DATA_DIR=reader.path.parent, SQLITE_ANN_MIN_CHUNKS=0)
    always_exact = create_store(settings)
    assert isinstance(always_exact, SqliteStore)
    try:
        assert [[h.chunk_id for h in always_exact.vector_search("c", q, 10)] for q in queries] == exact
        assert always_exact._vector_index("c").inverted is None  # no lists trained at all
    finally:
        always_exact.close()
    every_list = SqliteStore(reader.path, ann_probe_share=1.0)
    try:
        probed, _ = every_list._vector_index("c").approximate_top(queries[0], 10, None, 1.0) or (None, None)
        assert probed is not None and probed.size == 2 * DOCUMENTS  # through the lists, all of them
        assert [[h.chunk_id for h in every_list.vector_search("c", q, 10)] for q in queries] == exact
    finally:
        every_list.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [("SQLITE_ANN_MIN_CHUNKS", "-1"), ("SQLITE_ANN_PROBE_SHARE", "0"), ("SQLITE_ANN_PROBE_SHARE", "1.5")],
)
def test_out_of_range_settings_are_refused(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name):
        Settings()

"""Defect 5: a query's encode goes ahead of bulk work (ingest, index building) on the one encode thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from iris_rag.embedder import Embedder
from iris_rag.service import RagService
from iris_rag.techniques.colbert.index import TokenVectorIndex

SLICES = 8
TEXTS_PER_SLICE = 16


def _texts() -> list[str]:
    return [
        f"Sentence {i:04}: insulin resistance in skeletal muscle precedes type 2 diabetes in cohort {i:04}."
        for i in range(SLICES * TEXTS_PER_SLICE)
    ]


@pytest.fixture(autouse=True)
def _small_slices(embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 16 of these texts, so that a short run still has many."""
    monkeypatch.setattr(embedder, "bulk_slice_chars", TEXTS_PER_SLICE * len(_texts()[0]))


def _wait_for_first_slice(embedder: Embedder, before: int) -> None:
    deadline = time.monotonic() + 60
    while embedder.bulk_slices_run == before:
        assert time.monotonic() < deadline, "the bulk work never started"
        time.sleep(0.001)


def _query_overtakes(embedder: Embedder, bulk_work: Callable[[], object]) -> tuple[list[str], int]:
    """Run bulk_work on a thread; once its first slice ran, encode a query. Completion order and slices."""
    finished: list[str] = []
    before = embedder.bulk_slices_run

    def bulk() -> None:
        bulk_work()
        finished.append("bulk")

    worker = threading.Thread(target=bulk)
    worker.start()
    _wait_for_first_slice(embedder, before)
    embedder.encode_query("insulin and diabetes")
    finished.append("query")
    slices_when_query_done = embedder.bulk_slices_run - before
    worker.join(timeout=300)
    return finished, slices_when_query_done


def test_a_query_encode_completes_before_a_long_bulk_encode(embedder: Embedder) -> None:
    finished, slices = _query_overtakes(embedder, lambda: embedder.encode(_texts(), bulk=True))
    assert finished == ["query", "bulk"]
    assert slices < SLICES


def test_token_vector_building_yields_to_a_query(service: RagService) -> None:
    index = service.pipelines["colbert"].technique_index()
    assert isinstance(index, TokenVectorIndex)
    assert isinstance(service.embedder, Embedder)
    finished, slices = _query_overtakes(service.embedder, lambda: index.encoder.encode(_texts()))
    assert finished == ["query", "bulk"]
    assert slices < SLICES


@pytest.mark.parametrize("count", [1, TEXTS_PER_SLICE + 3])
def test_bulk_encode_gives_the_same_vectors_in_the_same_order(embedder: Embedder, count: int) -> None:
    texts = [f"{'word ' * (i % 7)}{_texts()[i]}" for i in range(count)]
    bulk = embedder.encode(texts, bulk=True)
    assert bulk.shape == (count, embedder.dimension)
    one_by_one = np.stack([embedder.encode_query(t) for t in texts])
    np.testing.assert_allclose(bulk, one_by_one, atol=1e-5)


def test_bulk_work_leaves_a_core_to_queries_only_while_they_arrive(
    embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from iris_rag import embedder as embedder_module

    every_core = embedder._batch_threads
    if every_core < 2:
        pytest.skip("one core: there is no core to leave free")

    def threads_per_slice() -> list[int]:
        half = embedder.bulk_slice_chars // 2  # two items per slice: a one-item slice runs as a query does
        return embedder.map_bulk(
            lambda _model, _part: torch.get_num_threads(), [1, 2, 3, 4], cost=lambda _: half
        )

    monkeypatch.setattr(embedder, "_last_query", float("-inf"))
    assert threads_per_slice() == [every_core, every_core], "no query lately: bulk work uses every core"
    embedder.encode_query(
        f"insulin and diabetes {time.monotonic()}"
    )  # new text: a remembered one needs no encode
    assert threads_per_slice() == [every_core - 1, every_core - 1], "a query just ran: one core left free"
    monkeypatch.setattr(embedder_module, "QUERY_WINDOW_S", 0.0)
    assert threads_per_slice() == [every_core, every_core], "past the window: every core again"


def test_a_query_encode_does_not_wait_for_the_running_bulk_slice(embedder: Embedder) -> None:
    """Queries encode on a thread and model copy of their own: a bulk slice that is still running (here
    one that blocks until told) does not hold them up, where the shared encode thread made them wait."""
    embedder.encode_query("load the query copy of the model first")
    started, release = threading.Event(), threading.Event()

    def blocking_slice(_model: object, part: list[str]) -> list[str]:
        started.set()
        assert release.wait(60), "never released"
        return part

    bulk = threading.Thread(target=lambda: embedder.map_bulk(blocking_slice, ["x"], cost=len))
    bulk.start()
    try:
        assert started.wait(60)
        # Behind the blocked slice this would never finish: the slice only ends after the query.
        vector = embedder.encode_query_async("insulin and diabetes").result(timeout=30)
        assert vector.shape == (embedder.dimension,)
        assert not release.is_set(), "the query finished while the bulk slice was still running"
    finally:
        release.set()
        bulk.join(60)


def test_a_repeated_query_is_embedded_once_and_its_vector_is_read_only(embedder: Embedder) -> None:
    first = embedder.encode_query("aspirin and heart attacks, remembered")
    again = embedder.encode_query("aspirin and heart attacks, remembered")
    assert again is first, "the second encode of the same query is the remembered vector"
    assert not first.flags.writeable
    other = embedder.encode_query("another question entirely")
    assert other is not first and float(other @ first) < 0.99


def test_waiting_for_a_model_that_never_loads_reports_progress_and_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from iris_rag import embedder as embedder_module
    from iris_rag.errors import ModelUnavailableError
    from iris_rag.progress import ProgressSink, progress_scope

    monkeypatch.setattr(embedder_module, "LOAD_HEARTBEAT_S", 0.05)
    monkeypatch.setattr(embedder_module, "LOAD_WAIT_LIMIT_S", 0.3)
    stuck = Embedder("never-loaded")  # no load started: it stays "loading"
    steps: list[str] = []
    sink = ProgressSink(lambda _n, message: steps.append(message))
    with progress_scope(sink), pytest.raises(ModelUnavailableError, match="still loading"):
        stuck.wait_ready()
    assert len(steps) >= 3 and steps[0] == "waiting for the embedding model to load"

"""Defect 4 (ingest side): a cancelled ingest stores nothing; a first ingest leaves no empty collection."""

from __future__ import annotations

import threading
import time

import pytest

from iris_rag.backends.sqlite.store import sqlite_connection
from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.embedder import Embedder
from iris_rag.errors import RequestCancelledError
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from tests.conftest import DOCUMENTS


def _documents(count: int) -> list[SourceDocument]:
    return [
        SourceDocument(
            f"d{i}", f"Document {i} reports that insulin lowers blood glucose in cohort {i}.", "", {}
        )
        for i in range(count)
    ]


def _collection_rows(service: RagService, collection_id: str) -> int:
    connection = sqlite_connection(service.store)
    row = connection.execute("SELECT COUNT(*) FROM collections WHERE id = ?", (collection_id,)).fetchone()
    return int(row[0])


def test_a_cancelled_first_ingest_leaves_no_collection(service: RagService) -> None:
    token = CancelToken()
    token.cancel("cancelled by the test")
    with cancellation_scope(token), pytest.raises(RequestCancelledError):
        service.ingestor.ingest("fresh", _documents(3))
    assert _collection_rows(service, "fresh") == 0
    assert service.store.document_ids("fresh") == []


def test_cancel_from_another_thread_after_the_first_slice_rolls_the_ingest_back(
    service: RagService, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = service.embedder
    assert isinstance(embedder, Embedder)
    monkeypatch.setattr(embedder, "bulk_slice_chars", 1000)  # a few documents per slice
    token = CancelToken()
    slices_before = embedder.bulk_slices_run

    def cancel_after_first_slice() -> None:
        deadline = time.monotonic() + 60
        while embedder.bulk_slices_run == slices_before and time.monotonic() < deadline:
            time.sleep(0.001)
        token.cancel("cancelled by the test")

    canceller = threading.Thread(target=cancel_after_first_slice)
    canceller.start()
    try:
        with cancellation_scope(token), pytest.raises(RequestCancelledError):
            service.ingestor.ingest("fresh", _documents(80))  # several slices of encoding
    finally:
        canceller.join()
    assert embedder.bulk_slices_run > slices_before, "the cancel came after real work"
    assert _collection_rows(service, "fresh") == 0
    assert service.store.document_ids("fresh") == []


def test_a_cancelled_ingest_into_an_existing_collection_changes_nothing(loaded_service: RagService) -> None:
    store = loaded_service.store
    before = store.get_document("docs", "aspirin")
    token = CancelToken()
    token.cancel("cancelled by the test")
    replacement = SourceDocument("aspirin", "Aspirin was replaced by a cancelled ingest.", "", {})
    with cancellation_scope(token), pytest.raises(RequestCancelledError):
        loaded_service.ingestor.ingest("docs", [replacement, *_documents(3)])
    assert store.get_document("docs", "aspirin") == before
    assert sorted(store.document_ids("docs")) == sorted(str(d["id"]) for d in DOCUMENTS)


def test_a_first_ingest_of_only_invalid_documents_creates_no_collection(service: RagService) -> None:
    result = service.ingestor.ingest("fresh", [SourceDocument("blank", "   ", "", {})])
    assert result.errors[0]["code"] == "INVALID_DOCUMENT"
    assert _collection_rows(service, "fresh") == 0

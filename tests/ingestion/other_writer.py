"""A hook that lets another writer act inside an ingest, after a reindex or a sync read the store."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from iris_rag.ingestion.ingestor import IngestResult
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService


def before_each_write(service: RagService, act: Callable[[], object]) -> None:
    """Run `act` inside each of the service's ingests: after the caller (a reindex, a sync) read the store."""
    ingest = service.ingestor.ingest

    def ingest_after(collection_id: str, documents: Iterable[SourceDocument], **options: Any) -> IngestResult:
        documents = list(documents)
        act()
        return ingest(collection_id, documents, **options)

    service.ingestor.ingest = ingest_after  # type: ignore[method-assign]

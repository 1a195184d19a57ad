"""Fixtures of the ingestion tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from iris_rag.embedder import Embedder
from iris_rag.service import RagService


@pytest.fixture
def other(any_service: RagService, embedder: Embedder) -> Iterator[RagService]:
    """Another process's service on the same store."""
    rag = RagService(any_service.settings, embedder=embedder)
    yield rag
    rag.close()

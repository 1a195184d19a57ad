"""`iris-rag reindex` (RagService.reindex) beside other writers: it rebuilds, it never edits or resurrects.

Another process is a second RagService on the same store (its own connection); its writes are made at the
moment between the reindex's reads and its write, by wrapping the reindexing service's ingest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.embedder import Embedder
from iris_rag.errors import CollectionNotFoundError
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.technique_index import DocumentCoverage
from tests.ingestion.other_writer import before_each_write


def _documents(count: int) -> list[SourceDocument]:
    return [
        SourceDocument(f"d{i}", f"Old text of document {i}, about river deltas.", f"D{i}", {})
        for i in range(count)
    ]


def test_a_document_changed_or_deleted_meanwhile_is_left_as_the_other_writer_left_it(
    any_service: RagService, other: RagService
) -> None:
    any_service.ingestor.ingest("c", _documents(5))

    def other_writes() -> None:
        other.ingestor.ingest("c", [SourceDocument("d1", "NEW text of document 1.", "D1", {})])
        other.store.delete_document("c", "d2")

    before_each_write(any_service, other_writes)
    summary = any_service.reindex("c")
    d1 = any_service.store.get_document("c", "d1")
    assert d1 is not None and d1.content == "NEW text of document 1."
    assert any_service.store.get_document("c", "d2") is None
    assert sorted(any_service.store.document_ids("c")) == ["d0", "d1", "d3", "d4"]
    assert summary["documents"] == 3
    assert summary["skipped"] == 2


def test_a_collection_deleted_meanwhile_is_collection_not_found(
    any_service: RagService, other: RagService
) -> None:
    any_service.ingestor.ingest("c", _documents(3))
    before_each_write(any_service, lambda: other.store.delete_collection("c"))
    with pytest.raises(CollectionNotFoundError, match="'c'"):
        any_service.reindex("c")
    assert any_service.store.get_collection("c") is None


def test_cli_reindex_of_a_collection_deleted_meanwhile_says_so_and_exits_2(
    tmp_path: Path,
    embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from iris_rag import cli

    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("RAG_TECHNIQUES", "basic")
    writer = RagService(Settings(RAG_DATA_DIR=tmp_path / "data", RAG_TECHNIQUES="basic"), embedder=embedder)
    writer.ingestor.ingest("c", _documents(3))
    real_reindex = RagService.reindex

    def reindex_with_a_delete(self: RagService, collection_id: str, **options: Any) -> dict[str, Any]:
        before_each_write(self, lambda: writer.store.delete_collection(collection_id))
        return real_reindex(self, collection_id, **options)

    monkeypatch.setattr(RagService, "reindex", reindex_with_a_delete)
    try:
        assert cli.main(["reindex", "--collection", "c"]) == 2
    finally:
        writer.close()
    assert "error COLLECTION_NOT_FOUND: collection 'c' does not exist" in capsys.readouterr().err


@pytest.fixture
def background(tmp_path: Path, embedder: Embedder) -> Iterator[RagService]:
    """A service whose ColBERT and NodeRAG indexes are built in the background (the default)."""
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "data", INDEX_BUILD="background", RAG_TECHNIQUES="basic,colbert,noderag"
    )
    rag = RagService(settings, embedder=embedder)
    yield rag
    rag.close()


def _coverage(service: RagService, collection_id: str) -> dict[str, int]:
    return {
        name: index.indexed_documents(collection_id)
        for name, pipeline in sorted(service.pipelines.items())
        if (index := pipeline.technique_index()) is not None and isinstance(index, DocumentCoverage)
    }


def test_reindex_never_takes_the_technique_indexes_away(background: RagService) -> None:
    """Each batch's old index rows answer until its new ones are in: the same transaction replaces them.

    The builder is stopped first: as for a reindex killed before the builder caught up, or another process
    reading meanwhile, what counts is what the store holds once each batch is committed.
    """
    background.ingestor.ingest("c", _documents(4))
    background.wait_for_indexes("c", quiet=True)
    assert _coverage(background, "c") == {"colbert": 4, "noderag": 4}
    assert background.index_builder is not None
    background.index_builder.close()
    seen: list[dict[str, int]] = []
    before_each_write(background, lambda: seen.append(_coverage(background, "c")))
    summary = background.reindex("c", batch_size=2)
    assert summary["documents"] == 4
    assert seen == [{"colbert": 4, "noderag": 4}] * 2
    assert _coverage(background, "c") == {"colbert": 4, "noderag": 4}

"""A collection's keyword vocabulary is read again when the collection has changed enough, not per write.

rag_crag (IDF in its evaluator, every call) and rag_hybrid_ifind's fuzzy repair read the whole vocabulary,
a scan of the keyword index (about 90 ms at 10K chunks on SQLite, seconds at 1M); before, the first call
after every write paid it. Real SQLite store and model; the store's reads are counted.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from iris_rag.retrieval import vocabulary
from iris_rag.retrieval.vocabulary import Vocabularies
from iris_rag.service import RagService
from iris_rag.stores.base import CollectionInfo
from tests.conftest import DOCUMENTS


class Reads:
    """Counts the store's vocabulary reads."""

    def __init__(self, service: RagService, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        read = service.store.term_document_counts

        def counted(collection_id: str) -> dict[str, int]:
            self.count += 1
            return read(collection_id)

        monkeypatch.setattr(service.store, "term_document_counts", counted)


def _document(
    number: int, content: str = "A short note on kinase inhibitors in cultured cells."
) -> dict[str, Any]:
    return {"id": f"note{number}", "title": f"Note {number}", "content": content}


def _call(service: RagService, technique: str, query: str, params: dict[str, Any]) -> dict[str, Any]:
    arguments = {
        "query": query,
        "collection_id": "docs",
        "technique_params": params,
        "options": {"generate": False},
    }
    result = service.execute({"technique": technique, "arguments": arguments})
    assert result["success"], result
    return result


@pytest.fixture
def docs(service: RagService, monkeypatch: pytest.MonkeyPatch) -> Reads:
    """The shared test documents plus 20 notes (23 chunks): two more notes move the count by under 10 %."""
    monkeypatch.setattr(vocabulary, "STALE_SHARE", 0.1)
    documents = DOCUMENTS + [_document(n) for n in range(20)]
    assert service.ingest({"collection_id": "docs", "documents": documents})["ingested_count"] == 23
    return Reads(service, monkeypatch)


def test_rag_crag_reads_the_vocabulary_again_only_when_the_collection_moved(
    service: RagService, docs: Reads
) -> None:
    _call(service, "crag", "Does aspirin lower heart attack risk?", {})
    assert docs.count == 1
    for number in range(20, 22):  # two writes of a chunk each: 25 chunks against 23, within 10 %
        service.ingest({"collection_id": "docs", "documents": [_document(number)]})
        _call(service, "crag", "Does aspirin lower heart attack risk?", {})
    assert docs.count == 1, "a write of one chunk read the whole vocabulary again"
    service.ingest({"collection_id": "docs", "documents": [_document(n) for n in range(22, 30)]})
    _call(service, "crag", "Does aspirin lower heart attack risk?", {})
    assert docs.count == 2, "eight more chunks (33 against 23) must read it again"


def test_rag_colbert_reads_its_idf_again_only_when_its_token_index_moved(
    service: RagService, docs: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ColBERT's word-piece IDF follows the same rule, on the chunks its (background-built) index holds."""
    rows = service.pipelines["colbert"].index.rows  # type: ignore[attr-defined]
    reads: list[str] = []
    read = rows.frequencies

    def counted(collection_id: str) -> tuple[int, dict[int, int]]:
        reads.append(collection_id)
        return read(collection_id)  # type: ignore[no-any-return]

    monkeypatch.setattr(rows, "frequencies", counted)
    _call(service, "colbert", "Does aspirin lower heart attack risk?", {})
    assert len(reads) == 1
    for number in range(20, 22):
        service.ingest({"collection_id": "docs", "documents": [_document(number)]})
        _call(service, "colbert", "Does aspirin lower heart attack risk?", {})
    assert len(reads) == 1, "a write of one chunk read the whole frequency table again"
    service.ingest({"collection_id": "docs", "documents": [_document(n) for n in range(22, 30)]})
    _call(service, "colbert", "Does aspirin lower heart attack risk?", {})
    assert len(reads) == 2, "eight more chunks with token rows (33 against 23) must read it again"


def test_fuzzy_repair_asks_the_current_vocabulary_before_calling_a_term_unknown(
    service: RagService, docs: Reads
) -> None:
    fuzzy = {"vector_weight": 0.0, "keyword_weight": 1.0, "enable_fuzzy_matching": True}
    _call(service, "hybrid_ifind", "kinase inhibitors", fuzzy)
    service.ingest(
        {"collection_id": "docs", "documents": [_document(40, "Zorblaxin binds the receptor in mice.")]}
    )
    known = _call(service, "hybrid_ifind", "kinase inhibitors", fuzzy)
    assert docs.count == 1, "known terms: the earlier read will do"
    assert known["metadata"]["technique_specific"]["fuzzy_expansions"] == {}
    new = _call(service, "hybrid_ifind", "zorblaxin", fuzzy)
    assert docs.count == 2, "a term unknown to the earlier read: the current vocabulary decides"
    assert new["metadata"]["technique_specific"]["fuzzy_expansions"] == {}, "written since: not misspelled"
    assert new["retrieved_documents"][0]["id"] == "note40"
    misspelled = _call(service, "hybrid_ifind", "kinaze", fuzzy)
    assert docs.count == 2, "the current read is kept for its version"
    assert misspelled["metadata"]["technique_specific"]["fuzzy_expansions"] == {"kinaze": ["kinas"]}


def test_a_read_is_kept_for_fewer_than_max_versions_and_the_same_collection(
    service: RagService, docs: Reads
) -> None:
    vocabularies = Vocabularies(service.store)
    collection = service.store.get_collection("docs")
    assert collection is not None
    counts = vocabularies.get(collection)
    assert "kinas" in counts and docs.count == 1

    def moved(**changes: Any) -> CollectionInfo:
        return dataclasses.replace(collection, **changes)

    assert vocabularies.get(moved(version=collection.version + vocabulary.MAX_VERSIONS - 1)) is counts
    assert docs.count == 1
    vocabularies.get(moved(version=collection.version + vocabulary.MAX_VERSIONS))
    assert docs.count == 2
    latest = collection.version + vocabulary.MAX_VERSIONS
    vocabularies.get(moved(version=latest + 1, created_at="2030-01-01T00:00:00Z"))  # deleted, made again
    assert docs.count == 3
    vocabularies.get(moved(version=latest + 2, chunk_count=collection.chunk_count))
    vocabularies.get(moved(version=latest + 2, chunk_count=collection.chunk_count), current=True)
    assert docs.count == 4, "current: read at this version, even when a close read is held for it"
    vocabularies.get(moved(version=latest + 2), current=True)
    assert docs.count == 4

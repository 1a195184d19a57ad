"""Managing documents: rag_list_documents (pages), rag_delete_documents (ids or filter), on each backend."""

from __future__ import annotations

from typing import Any

import pytest

from iris_rag.access import Principal, principal_scope
from iris_rag.errors import CollectionNotFoundError, ForbiddenError, InvalidParametersError
from iris_rag.service import RagService
from tests.conftest import DOCUMENTS

EXTRA = [
    {
        "id": f"note-{i}",
        "title": f"Note {i}",
        "content": f"Note number {i} about tides.",
        "metadata": {"n": i},
    }
    for i in range(5)
]


@pytest.fixture
def loaded(any_service: RagService) -> RagService:
    any_service.ingest({"collection_id": "docs", "documents": [*DOCUMENTS, *EXTRA]})
    return any_service


def test_documents_are_listed_a_page_at_a_time_in_ingest_order(loaded: RagService) -> None:
    first = loaded.list_documents({"collection_id": "docs", "limit": 3})
    assert first["document_count"] == 8
    assert [d["id"] for d in first["documents"]] == ["aspirin", "volcano", "sourdough"]
    assert (
        first["documents"][0]["chars"] == len(DOCUMENTS[0]["content"])
        and first["documents"][0]["chunks"] == 1
    )
    seen = [d["id"] for d in first["documents"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = loaded.list_documents({"collection_id": "docs", "limit": 3, "cursor": cursor})
        seen += [d["id"] for d in page["documents"]]
        cursor = page["next_cursor"]
    assert seen == ["aspirin", "volcano", "sourdough", *(d["id"] for d in EXTRA)]
    with pytest.raises(CollectionNotFoundError):
        loaded.list_documents({"collection_id": "missing"})


def test_delete_by_ids_and_by_filter_take_every_row_with_them(loaded: RagService) -> None:
    result = loaded.delete_documents({"collection_id": "docs", "document_ids": ["volcano", "nope"]})
    assert (result["deleted_ids"], result["not_found_ids"]) == (["volcano"], ["nope"])
    by_filter = loaded.delete_documents({"collection_id": "docs", "filter": {"n": {"gte": 3}}})
    assert by_filter["deleted_ids"] == ["note-3", "note-4"] and by_filter["deleted_count"] == 2
    listed = loaded.list_documents({"collection_id": "docs", "limit": 50})
    assert [d["id"] for d in listed["documents"]] == ["aspirin", "sourdough", "note-0", "note-1", "note-2"]
    answer = loaded.execute(
        {
            "technique": "hybrid_ifind",
            "arguments": {"query": "basaltic lava volcano", "collection_id": "docs", "options": {"top_k": 8}},
        }
    )
    assert "volcano" not in {d["id"] for d in answer["retrieved_documents"]}, "gone from both legs"
    again = loaded.delete_documents({"collection_id": "docs", "document_ids": ["volcano"]})
    assert again["deleted_count"] == 0 and again["not_found_ids"] == ["volcano"], "idempotent"


def test_bad_deletes_are_refused_and_change_nothing(loaded: RagService) -> None:
    for arguments in (
        {"collection_id": "docs"},
        {"collection_id": "docs", "document_ids": ["a"], "filter": {"n": 1}},
        {"collection_id": "docs", "filter": {}},
    ):
        with pytest.raises(InvalidParametersError):
            loaded.delete_documents(arguments)
    with pytest.raises(CollectionNotFoundError):
        loaded.delete_documents({"collection_id": "missing", "document_ids": ["a"]})
    reader = Principal("reader", frozenset({"read"}), None)
    with principal_scope(reader), pytest.raises(ForbiddenError):
        loaded.delete_documents({"collection_id": "docs", "document_ids": ["aspirin"]})
    other = Principal("other", frozenset({"read", "write"}), frozenset({"elsewhere"}))
    with principal_scope(other), pytest.raises(ForbiddenError):
        loaded.delete_documents({"collection_id": "docs", "document_ids": ["aspirin"]})
    with principal_scope(other), pytest.raises(CollectionNotFoundError):
        loaded.list_documents({"collection_id": "docs"})
    assert loaded.list_documents({"collection_id": "docs"})["document_count"] == 8


def test_the_cli_lists_and_deletes(loaded: RagService, capsys: pytest.CaptureFixture[str]) -> None:
    import orjson

    from iris_rag.cli import build_parser

    def run(*argv: str) -> dict[str, Any]:
        args = build_parser().parse_args(list(argv))
        assert args.handler(args, loaded) == 0
        parsed: dict[str, Any] = orjson.loads(capsys.readouterr().out)
        return parsed

    page = run("documents", "--collection", "docs", "--limit", "2", "--offset", "1")
    assert [d["id"] for d in page["documents"]] == ["volcano", "sourdough"]
    assert run("delete", "--collection", "docs", "aspirin")["deleted_ids"] == ["aspirin"]
    assert run("delete", "--collection", "docs", "--filter", '{"n": 0}')["deleted_ids"] == ["note-0"]

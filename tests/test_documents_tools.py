"""Managing documents: rag_list_documents (pages), rag_delete_documents (ids or filter), on each backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from iris_rag.access import Principal, principal_scope
from iris_rag.errors import (
    CollectionNotFoundError,
    DocumentNotFoundError,
    ForbiddenError,
    InvalidParametersError,
)
from iris_rag.service import RagService
from iris_rag.stores.base import KeywordQuery
from iris_rag.worker.dispatch import Dispatcher
from iris_rag.worker.protocol import success_line
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


def test_deleting_a_collection_takes_every_row_of_it_and_nothing_else(loaded: RagService) -> None:
    from iris_rag.techniques.colbert.storage import TokenVectorStorage
    from iris_rag.techniques.graphrag.storage import KnowledgeGraphStorage
    from iris_rag.techniques.noderag.storage import NodeTreeStorage
    from iris_rag.techniques.sqlrag.pipeline import SqlRagPipeline
    from iris_rag.techniques.sqlrag.storage import StructuredTableStorage

    store = loaded.store
    loaded.ingest({"collection_id": "other", "documents": DOCUMENTS})
    sqlrag = loaded.pipelines["sqlrag"]
    assert isinstance(sqlrag, SqlRagPipeline)
    sqlrag.ingest_table({"table": "sales", "collection_id": "docs", "rows": [{"region": "north", "n": 1}]})
    sqlrag.table_schema({"collection_id": "docs"})  # the documents view exists
    graph = store.technique_storage(KnowledgeGraphStorage)
    assert graph.counts("docs")["entities"] > 0

    with pytest.raises(InvalidParametersError, match="confirm_collection_id"):
        loaded.delete_collection({"collection_id": "docs", "confirm_collection_id": "doc"})
    result = loaded.delete_collection({"collection_id": "docs", "confirm_collection_id": "docs"})
    assert result == {"collection_id": "docs", "deleted": True, "documents_deleted": 8}

    assert [c["id"] for c in loaded.list_collections({})["collections"]] == ["other"]
    assert graph.counts("docs") == {"documents": 0, "entities": 0, "mentions": 0, "relations": 0}
    assert graph.graph_record("docs") is None
    assert store.technique_storage(NodeTreeStorage).indexed_documents("docs") == 0
    assert store.technique_storage(TokenVectorStorage).frequencies("docs") == (0, {})
    tables = store.technique_storage(StructuredTableStorage)
    assert tables.view_for("docs") is None and tables.get_table("t_sales") is None
    assert store.keyword_search("docs", KeywordQuery.of(["lava"]), 5) == []
    with pytest.raises(CollectionNotFoundError):
        loaded.delete_collection({"collection_id": "docs", "confirm_collection_id": "docs"})
    # The other collection answers as before; the deleted one can be made again from scratch.
    answer = loaded.execute(
        {"technique": "graphrag", "arguments": {"query": "volcano lava", "collection_id": "other"}}
    )
    assert answer["retrieved_documents"][0]["id"] == "volcano"
    loaded.ingest({"collection_id": "docs", "documents": DOCUMENTS[:1]})
    assert loaded.list_documents({"collection_id": "docs"})["document_count"] == 1
    assert graph.counts("docs")["documents"] == 1


def test_the_cli_deletes_a_collection_only_with_yes(
    loaded: RagService, capsys: pytest.CaptureFixture[str]
) -> None:
    from iris_rag.cli import build_parser

    unconfirmed = build_parser().parse_args(["delete-collection", "docs"])
    assert unconfirmed.handler(unconfirmed, loaded) == 2
    assert "--yes" in capsys.readouterr().out
    assert loaded.list_documents({"collection_id": "docs"})["document_count"] == 8
    confirmed = build_parser().parse_args(["delete-collection", "docs", "--yes"])
    assert confirmed.handler(confirmed, loaded) == 0
    assert loaded.list_collections({})["collections"] == []


def test_a_collection_description_is_set_listed_and_replaced(loaded: RagService) -> None:
    listed = {c["id"]: c for c in loaded.list_collections({})["collections"]}
    assert listed["docs"]["description"] == ""
    set_once = loaded.update_collection({"collection_id": "docs", "description": "Science notes."})
    assert set_once["description"] == "Science notes." and set_once["updated_at"]
    loaded.update_collection({"collection_id": "docs", "description": "Notes on tides."})
    listed = {c["id"]: c for c in loaded.list_collections({})["collections"]}
    assert listed["docs"]["description"] == "Notes on tides."
    assert listed["docs"]["document_count"] == 8, "describing a collection leaves its documents alone"
    # As at ingest, a NUL is dropped: PostgreSQL's text cannot hold one.
    assert (
        loaded.update_collection({"collection_id": "docs", "description": "Ti\x00des."})["description"]
        == "Tides."
    )


def test_describing_a_missing_or_unwritable_collection_is_refused(loaded: RagService) -> None:
    with pytest.raises(CollectionNotFoundError):
        loaded.update_collection({"collection_id": "nope", "description": "x"})
    with pytest.raises(InvalidParametersError):
        loaded.update_collection({"collection_id": "docs", "description": "x" * 2001})
    reader = Principal("reader", frozenset({"read"}), frozenset({"docs"}))
    with principal_scope(reader), pytest.raises(ForbiddenError):
        loaded.update_collection({"collection_id": "docs", "description": "mine now"})


def test_a_missing_collection_is_told_apart_from_a_missing_document(loaded: RagService) -> None:
    with pytest.raises(CollectionNotFoundError) as missing:
        loaded.get_document({"collection_id": "typo", "document_id": "aspirin"})
    assert missing.value.details["known_collections"] == ["docs"]
    with pytest.raises(DocumentNotFoundError, match="no document 'nope' in collection 'docs'"):
        loaded.get_document({"collection_id": "docs", "document_id": "nope"})


def test_nul_characters_are_dropped_at_ingest_alike_on_every_backend(loaded: RagService) -> None:
    """PostgreSQL's text cannot hold a NUL and SQLite's length() stops at one: no store keeps them."""
    content = "Before the NUL\x00 and after it, the text goes on about tides."
    document = {"id": "nul", "title": "Ti\x00des", "content": content, "metadata": {"note\x00": "a\x00b"}}
    result = loaded.ingest({"collection_id": "docs", "documents": [document]})
    assert result["ingested_count"] == 1 and not result.get("errors")
    stored = loaded.get_document({"collection_id": "docs", "document_id": "nul"})
    assert stored["content"] == content.replace("\x00", "") and stored["title"] == "Tides"
    assert stored["metadata"]["note"] == "ab"
    listed = loaded.list_documents({"collection_id": "docs", "limit": 50})["documents"]
    assert next(d["chars"] for d in listed if d["id"] == "nul") == len(stored["content"])
    refused = loaded.ingest({"collection_id": "docs", "documents": [{"id": "a\x00b", "content": "x"}]})
    assert refused["ingested_count"] == 0 and "NUL" in refused["errors"][0]["message"]


def test_nul_characters_in_tables_and_call_ids_are_dropped_on_every_backend(loaded: RagService) -> None:
    """rag_ingest_table's cells and column names, and a call's request_id, reach the store without a NUL."""
    table = {"collection_id": "docs", "table": "notes", "rows": [{"te\x00xt": "x\x00y", "n": 1}]}
    dispatcher = Dispatcher(loaded)
    ok, ingested = dispatcher.call("ingest_table", table)
    assert ok, ingested
    arguments = {
        "query": "tides",
        "collection_id": "docs",
        "request_id": "r\x00q",
        "options": {"generate": False},
    }
    ok, answer = dispatcher.call("execute", {"technique": "basic", "arguments": arguments})
    assert ok and answer["request_id"] == "rq"
    sql = {"sql": "SELECT text FROM t_notes"}
    ok, rows = dispatcher.call(
        "execute", {"technique": "sqlrag", "arguments": {**arguments, "technique_params": sql}}
    )
    assert ok and rows["metadata"]["technique_specific"]["rows"] == [["xy"]], rows
    loaded.monitor.flush()
    recent = loaded.monitor.metrics("1h")["recent_calls"]
    assert "rq" in {call["request_id"] for call in recent}


def test_large_float_metadata_reads_back_as_a_float_on_every_backend(loaded: RagService) -> None:
    """PostgreSQL's jsonb writes 1e20 as 100000000000000000000: read as an int, no answer could encode it."""
    metadata = {"population": 1e20, "tiny": 1e-300, "huge": 1e300, "count": 2**53 + 1}
    loaded.ingest(
        {
            "collection_id": "docs",
            "documents": [{"id": "big", "content": "Big numbers.", "metadata": metadata}],
        }
    )
    stored = loaded.get_document({"collection_id": "docs", "document_id": "big"})["metadata"]
    assert {key: stored[key] for key in metadata} == metadata
    assert all(type(stored[key]) is type(value) for key, value in metadata.items())
    success_line(1, stored)  # what the worker writes: it must encode


def test_health_details_show_a_key_only_its_own_collections(loaded: RagService) -> None:
    """rag_health_check listed other keys' collections (GraphRAG's counts per collection, store totals)."""
    loaded.ingest(
        {"collection_id": "secret-papers", "documents": [{"id": "s", "content": "Tides follow the moon."}]}
    )
    loaded.wait_for_indexes()
    everything = json.dumps(loaded.health_check({"include_details": True}))
    assert "secret-papers" in everything  # the local user sees it: the check below can fail
    other = Principal("other", frozenset({"read"}), frozenset({"docs"}))
    with principal_scope(other):
        health = loaded.health_check({"include_details": True})
    assert "secret-papers" not in json.dumps(health)
    store = health["components"]["vector_store"]["details"]
    assert (store["collections"], store["documents"], store["chunks"]) == (1, 8, 8)
    assert "path" not in store  # where the server keeps its files is not a key's business
    assert list(store["index_build"]["collections"]) in ([], ["docs"])


def test_the_embedding_cache_tells_a_key_nothing_of_collections_it_cannot_see(loaded: RagService) -> None:
    """embeddings_reused (and the time saved) told a key whether another collection held a given text."""
    held = {"id": "probe", "title": DOCUMENTS[0]["title"], "content": DOCUMENTS[0]["content"]}
    assert loaded.ingest({"collection_id": "other", "documents": [held]})["embeddings_reused"] == 1
    writer = Principal("writer", frozenset({"read", "write"}), frozenset({"mine"}))
    with principal_scope(writer):
        first = loaded.ingest({"collection_id": "mine", "documents": [held]})
        again = loaded.ingest({"collection_id": "mine", "documents": [{**held, "id": "again"}]})
    assert (first["embeddings_reused"], again["embeddings_reused"]) == (0, 1)
    # The operator's reindex reads the collection's own entries: nothing is embedded again.
    own = {"id": "own", "content": "Tidal bores run upriver. Only this key's collection holds this text."}
    with principal_scope(writer):
        loaded.ingest({"collection_id": "mine", "documents": [own]})
    assert loaded.reindex("mine")["embeddings_reused"] == 3

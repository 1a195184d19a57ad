"""Collection grants in the worker: a principal sent with a bridge request sees only its collections."""

from __future__ import annotations

import orjson
import pytest

from iris_rag.access import Principal
from iris_rag.errors import MalformedRequestError
from iris_rag.service import RagService
from iris_rag.worker.dispatch import Dispatcher
from iris_rag.worker.protocol import parse_request

ALICE = Principal("alice", frozenset({"read", "write"}), frozenset({"papers"}))
READER = Principal("reader", frozenset({"read"}), None)
DOCS = [{"id": "d1", "content": "Rivers carry water to the sea."}]


@pytest.fixture
def dispatcher(service: RagService) -> Dispatcher:
    for collection in ("papers", "secret"):
        service.ingest({"collection_id": collection, "documents": DOCS})
    return Dispatcher(service)


def test_listing_and_reads_hide_other_collections(dispatcher: Dispatcher) -> None:
    ok, listing = dispatcher.call("list_collections", {}, ALICE)
    assert ok and [c["id"] for c in listing["collections"]] == ["papers"]
    ok, _ = dispatcher.call("get_document", {"collection_id": "papers", "document_id": "d1"}, ALICE)
    assert ok
    ok, hidden = dispatcher.call("get_document", {"collection_id": "secret", "document_id": "d1"}, ALICE)
    ok_missing, missing = dispatcher.call(
        "get_document", {"collection_id": "nope", "document_id": "d1"}, ALICE
    )
    assert not ok and not ok_missing
    assert hidden["code"] == missing["code"] == "COLLECTION_NOT_FOUND"
    assert hidden["details"]["known_collections"] == missing["details"]["known_collections"] == ["papers"]
    ok, absent = dispatcher.call("get_document", {"collection_id": "papers", "document_id": "nope"}, ALICE)
    assert not ok and absent["code"] == "DOCUMENT_NOT_FOUND"

    query = {"query": "rivers", "options": {"generate": False}}
    ok, hidden = dispatcher.call(
        "execute", {"technique": "basic", "arguments": {**query, "collection_id": "secret"}}, ALICE
    )
    _, missing = dispatcher.call(
        "execute", {"technique": "basic", "arguments": {**query, "collection_id": "nope"}}, ALICE
    )
    assert not ok and hidden["code"] == missing["code"] == "COLLECTION_NOT_FOUND"
    assert hidden["details"]["known_collections"] == ["papers"]
    assert "secret" not in hidden["message"].replace("'secret' does not exist", "")
    # The local user (no principal) sees everything.
    ok, listing = dispatcher.call("list_collections", {})
    assert [c["id"] for c in listing["collections"]] == ["papers", "secret"]


def test_writes_need_the_write_scope_and_a_grant(dispatcher: Dispatcher) -> None:
    ok, _ = dispatcher.call("ingest", {"collection_id": "papers", "documents": DOCS}, ALICE)
    assert ok
    for collection in ("secret", "brand-new"):  # existing or not: the same refusal
        ok, error = dispatcher.call("ingest", {"collection_id": collection, "documents": DOCS}, ALICE)
        assert not ok and error["code"] == "FORBIDDEN"
        assert error["message"] == f"this key may not write to collection {collection!r}"
    ok, error = dispatcher.call("ingest", {"collection_id": "papers", "documents": DOCS}, READER)
    assert not ok and error["code"] == "FORBIDDEN" and "write" in error["message"]


def test_call_records_carry_the_principal_and_metrics_are_per_key(dispatcher: Dispatcher) -> None:
    dispatcher.call("list_collections", {}, ALICE)
    dispatcher.call("list_collections", {}, READER)
    dispatcher.call("list_collections", {})
    dispatcher.service.monitor.flush()
    ok, mine = dispatcher.call("metrics", {"time_range": "1h"}, ALICE)
    assert ok and "by_principal" not in mine
    assert mine["by_tool"]["rag_list_collections"]["request_count"] == 1
    ok, everyone = dispatcher.call("metrics", {"time_range": "1h"})
    assert {"alice", "reader", "local"} <= set(everyone["by_principal"])


def test_the_wire_principal_is_checked() -> None:
    line = orjson.dumps({"id": "7", "method": "list_collections", "params": {}, "principal": {"id": "a"}})
    request = parse_request(line)
    assert request.principal == Principal("a", frozenset(), frozenset())
    star = parse_request(orjson.dumps({"id": 1, "method": "m", "principal": {"id": "a", "collections": "*"}}))
    assert star.principal is not None and star.principal.collections is None
    with pytest.raises(MalformedRequestError) as raised:
        parse_request(orjson.dumps({"id": "8", "method": "m", "principal": {"id": 3}}))
    assert raised.value.details == {"id": "8"}


def test_rag_sqlrag_answers_a_hidden_collections_table_as_one_that_does_not_exist(
    dispatcher: Dispatcher,
) -> None:
    def refusal(sql: str) -> str:
        arguments = {"query": "count", "collection_id": "papers", "technique_params": {"sql": sql}}
        ok, error = dispatcher.call("execute", {"technique": "sqlrag", "arguments": arguments}, ALICE)
        assert not ok, sql
        return str(error["message"])

    for table in ("documents_secret", "DOCUMENTS_SECRET"):
        assert refusal(f"SELECT count(*) FROM {table}") == refusal(
            f"SELECT count(*) FROM {table.replace('secret', 'nopes').replace('SECRET', 'NOPES')}"
        ).replace("nopes", "secret").replace("NOPES", "SECRET")
    # The local user (no principal) is told the table is another collection's.
    sql = {"sql": "SELECT 1 FROM documents_secret"}
    arguments = {"query": "count", "collection_id": "papers", "technique_params": sql}
    ok, error = dispatcher.call("execute", {"technique": "sqlrag", "arguments": arguments})
    assert not ok and "not in allowed_tables" in error["message"]


def test_rag_ingest_table_replaces_only_a_table_of_its_own_collection(any_service: RagService) -> None:
    """A table name is one per store: naming another collection's table, or a shared one, replaces nothing.

    Security report, defect 2: a key that may write only its own collection replaced (and so read and
    destroyed) another collection's table and a shared table by ingesting a table of the same name.
    """
    dispatcher = Dispatcher(any_service)
    for collection in ("papers", "secret"):
        any_service.ingest({"collection_id": collection, "documents": DOCS})

    def ingest_table(arguments: dict[str, object], principal: Principal | None = ALICE) -> dict[str, object]:
        ok, answer = dispatcher.call("ingest_table", {"rows": [{"who": "alice"}], **arguments}, principal)
        return {"ok": ok, **answer}

    def rows(collection: str, table: str) -> list[list[object]]:
        sql = {"sql": f"SELECT * FROM {table}", "combine_with_vector": False}
        arguments = {"query": "q", "collection_id": collection, "technique_params": sql}
        ok, result = dispatcher.call("execute", {"technique": "sqlrag", "arguments": arguments})
        assert ok, result
        found: list[list[object]] = result["metadata"]["technique_specific"]["rows"]
        return found

    assert ingest_table({"table": "pay", "collection_id": "secret", "rows": [{"who": "bob"}]}, None)["ok"]
    assert ingest_table({"table": "shared", "rows": [{"who": "everyone"}]}, None)["ok"]

    # Another collection's table, hidden from the key: FORBIDDEN, naming neither its collection nor more.
    hidden = ingest_table({"table": "pay", "collection_id": "papers"})
    assert not hidden["ok"] and hidden["code"] == "FORBIDDEN", hidden
    assert "secret" not in orjson.dumps(hidden).decode()
    assert rows("secret", "t_pay") == [["bob"]], "the other collection's table is untouched"
    # A shared table needs a key granted every collection, whatever collection_id names.
    shared = ingest_table({"table": "shared", "collection_id": "papers"})
    assert not shared["ok"] and shared["code"] == "FORBIDDEN", shared
    assert rows("papers", "t_shared") == [["everyone"]]
    # The key's own table is replaced as before.
    assert ingest_table({"table": "mine", "collection_id": "papers"})["ok"]
    again = ingest_table({"table": "mine", "collection_id": "papers", "rows": [{"who": "alice again"}]})
    assert again["ok"] and again["replaced"] is True and rows("papers", "t_mine") == [["alice again"]]

    # Even a caller who may write both collections does not move a table by naming another collection:
    # the owner's statements would lose it without a word. The refusal names the owner.
    for owner, target in (("secret", "papers"), (None, "papers"), ("secret", None)):
        table = "pay" if owner else "shared"
        moved = ingest_table({"table": table, **({"collection_id": target} if target else {})}, None)
        assert not moved["ok"] and moved["code"] == "INVALID_PARAMETERS", moved
        assert (repr(owner) if owner else "shared by every collection") in str(moved["message"])
    assert rows("secret", "t_pay") == [["bob"]] and rows("papers", "t_shared") == [["everyone"]]

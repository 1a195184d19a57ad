"""Metadata filters mean the same on every store: JSON equality and typed ranges, as PostgreSQL's jsonb.

SQLite's json_extract gives `true` as 1 and orders any string above any number, so before its filters
typed their comparisons it matched {"flag": 1} to `true` and {"s": {"gt": 100}} to "abc"; an object inside
`in` failed to bind. A list matches when one of its elements does (by the same typed equality), and an
object's members are not elements. Each case runs on every backend (any_store) and must select exactly the
same documents, through matching_document_ids and through the dense and both keyword searches.
"""

from __future__ import annotations

from typing import Any

import pytest

from iris_rag.errors import InvalidParametersError
from iris_rag.service import RagService
from iris_rag.stores.base import DocumentStore, KeywordQuery
from iris_rag.stores.filters import parse_filters
from tests.backends.contract.corpus import document, new_collection, unit_vector
from tests.conftest import DOCUMENTS

# Values chosen so a store that ignores JSON types matches more (or fewer) documents than jsonb does.
METADATA: dict[str, dict[str, Any]] = {
    "t": {
        "flag": True,
        "n": 1,
        "s": "2020",
        "y": 2020,
        "obj": {"a": 1, "b": [1, 2]},
        "arr": [1, "x"],
        "nul": None,
        "list": [True, "2020", {"k": 1}, [1, 2], None],
    },
    "one": {
        "flag": 1,
        "n": True,
        "s": 2020,
        "y": "2020",
        "obj": {"b": [1, 2], "a": 1.0},
        "arr": [1, "x"],
        "list": [1, 2020, "abc"],
    },
    "f": {
        "flag": False,
        "n": 0,
        "s": "abc",
        "y": 2020.0,
        "obj": {"a": 2},
        "arr": ["x", 1],
        "nul": "null",
        "list": [0.0, "2021-06-01"],
    },
    "z": {"flag": 0, "y": "2021-01-01", "nul": 0, "obj": '{"a": 2}', "list": {"k": 1, "x": True}},
    "none": {},
}

CASES: list[tuple[dict[str, Any], set[str]]] = [
    # Booleans are not numbers.
    ({"flag": True}, {"t"}),
    ({"flag": 1}, {"one"}),
    ({"flag": False}, {"f"}),
    ({"flag": 0}, {"z"}),
    ({"n": True}, {"one"}),
    ({"n": 1}, {"t"}),
    ({"flag": {"gte": 0}}, {"one", "z"}),
    ({"flag": {"in": [True, 0]}}, {"t", "z"}),
    # Strings are not numbers; a number equals its float spelling.
    ({"s": "2020"}, {"t"}),
    ({"s": 2020}, {"one"}),
    ({"y": 2020}, {"t", "f"}),
    ({"y": "2020"}, {"one"}),
    ({"y": {"in": [2020, "2021-01-01"]}}, {"t", "f", "z"}),
    # A range compares numbers with numbers and strings (ISO dates) with strings only.
    ({"s": {"gt": 100}}, {"one"}),
    ({"y": {"gt": 2019}}, {"t", "f"}),
    ({"y": {"lt": "2020-06-01"}}, {"one"}),
    ({"y": {"gte": "2020-06-01"}}, {"z"}),
    # null is a value of its own (a missing field is not null).
    ({"nul": None}, {"t"}),
    ({"nul": {"in": [None, 0]}}, {"t", "z"}),
    # Objects and arrays inside `in`: JSON equality (key order does not matter, 1 equals 1.0).
    ({"obj": {"in": [{"a": 1, "b": [1, 2]}]}}, {"t", "one"}),
    ({"obj": {"in": [{"a": 2}, "x"]}}, {"f"}),
    ({"obj": {"in": ['{"a": 2}']}}, {"z"}),
    ({"arr": {"in": [[1, "x"]]}}, {"t", "one"}),
    ({"arr": {"in": [["x", 1], 5]}}, {"f"}),
    ({"arr": {"in": [[1]]}}, set()),
    # A list's elements compare alike; an object's members are not elements.
    ({"arr": "x"}, {"t", "one", "f"}),
    ({"list": True}, {"t"}),
    ({"list": 1}, {"one"}),
    ({"list": 0}, {"f"}),
    ({"list": "2020"}, {"t"}),
    ({"list": 2020}, {"one"}),
    ({"list": None}, {"t"}),
    ({"list": {"in": ["abc", 0]}}, {"one", "f"}),
    ({"list": {"in": [{"k": 1}]}}, {"t"}),
    ({"list": {"in": [[1.0, 2]]}}, {"t"}),
    ({"list": {"gt": 100}}, {"one"}),
    ({"list": {"lt": "2021-01-01"}}, {"t"}),
    ({"obj": 1}, set()),
]


@pytest.fixture
def typed(any_store: DocumentStore) -> DocumentStore:
    new_collection(any_store)
    documents = [document(i, [f"common {i}word"], metadata=m) for i, m in METADATA.items()]
    any_store.upsert_documents("c", documents)
    return any_store


@pytest.mark.parametrize(("raw", "expected"), CASES, ids=[str(raw) for raw, _ in CASES])
def test_every_store_selects_the_same_documents(
    typed: DocumentStore, raw: dict[str, Any], expected: set[str]
) -> None:
    metadata_filter = parse_filters(raw)
    assert metadata_filter is not None
    assert typed.matching_document_ids("c", metadata_filter) == expected
    chunks = {f"{i}#0" for i in expected}
    assert {h.chunk_id for h in typed.vector_search("c", unit_vector(3), 10, metadata_filter)} == chunks
    for scoring in ("flat", "multifield"):
        query = KeywordQuery.of(["common"], scoring=scoring)
        assert {h.chunk_id for h in typed.keyword_search("c", query, 10, metadata_filter)} == chunks


@pytest.mark.parametrize(
    "bad",
    [
        {"y": {"gt": float("nan")}},
        {"y": {"lt": float("inf")}},
        {"y": {"gt": 10**400}},
        {"y": 2**64},
        {"y": float("nan")},
        {"y": {"in": [1, 2**70]}},
        {"y": {"in": [{"a": [2**70]}]}},
        {"y": {"in": [{"a": object()}]}},
        {"y": {"in": [{1: "a"}]}},
        {"y": b"2020"},
    ],
    ids=repr,
)
def test_values_no_store_can_compare_are_invalid_parameters(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidParametersError):
        parse_filters(bad)


def test_typed_filters_through_a_technique(any_service: RagService) -> None:
    """Over the service (rag_basic, rag_hybrid_ifind): a boolean is not 1, a number is not its string.

    The tool schema admits only scalars in a filter, so an object inside `in` (or an integer no store can
    bind) comes back as INVALID_PARAMETERS on every backend.
    """
    documents = [
        {**DOCUMENTS[0], "metadata": {"reviewed": True, "year": "2019"}},
        {**DOCUMENTS[1], "metadata": {"reviewed": 1, "year": 2021}},
        {**DOCUMENTS[2], "metadata": {"reviewed": False, "year": 2020.0}},
    ]
    assert any_service.ingest({"collection_id": "docs", "documents": documents})["ingested_count"] == 3

    def ask(technique: str, filters: dict[str, Any]) -> dict[str, Any]:
        arguments = {"query": "heart lava bread", "collection_id": "docs", "options": {"filters": filters}}
        return any_service.execute({"technique": technique, "arguments": arguments})

    for technique in ("basic", "hybrid_ifind"):
        for filters, expected in (
            ({"reviewed": 1}, {"volcano"}),
            ({"reviewed": {"in": [True, False]}}, {"aspirin", "sourdough"}),
            ({"year": {"gte": 2000}}, {"volcano", "sourdough"}),
            ({"year": {"in": [2020, "2019"]}}, {"aspirin", "sourdough"}),
        ):
            result = ask(technique, filters)
            assert {d["id"] for d in result["retrieved_documents"]} == expected, (technique, filters)
            assert result["metadata"]["filters"]["matched_documents"] == len(expected)
        for bad in ({"tag": {"in": [{"kind": "drug"}]}}, {"year": 2**70}, {"year": {"gt": 10**400}}):
            with pytest.raises(InvalidParametersError):
                ask(technique, bad)

"""Metadata filters: equality, `in`, ranges on numbers and ISO dates, booleans, lists, and unknown fields.

Each filter is checked three ways, which must agree: the matching ids, and the dense and keyword
searches restricted to them (every document holds the word "common", so keyword search sees them all).
"""

from __future__ import annotations

from typing import Any

import pytest

from iris_rag.stores.base import DocumentStore, KeywordQuery
from iris_rag.stores.filters import parse_filters
from tests.backends.contract.corpus import document, new_collection, unit_vector

METADATA: dict[str, dict[str, Any]] = {
    "a": {"year": 2019, "score": 0.5, "published": "2019-03-01", "open": True, "topic": "cardiology"},
    "b": {"year": 2020, "score": 1.5, "published": "2020-07-15", "open": False, "topic": "geology"},
    "c": {"year": 2021, "score": 2.5, "published": "2021-01-31", "open": True, "topic": "food"},
    "d": {"year": 2022, "score": -1.0, "published": "2022-12-24", "open": False, "topic": "geology"},
    "e": {"topic": "food"},  # none of the other fields
    "f": {"year": 2020, "topic": "cardiology", "tags.main": "x"},
}


@pytest.fixture
def filtered(store: DocumentStore) -> DocumentStore:
    new_collection(store)
    store.upsert_documents("c", [document(i, [f"common {i}word"], metadata=m) for i, m in METADATA.items()])
    return store


CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"topic": "geology"}, {"b", "d"}),
    ({"year": 2020}, {"b", "f"}),
    ({"score": 1.5}, {"b"}),
    ({"topic": {"in": ["food", "cardiology"]}}, {"a", "c", "e", "f"}),
    ({"year": {"in": [2019, 2022, 1999]}}, {"a", "d"}),
    ({"year": {"gt": 2020}}, {"c", "d"}),
    ({"year": {"gte": 2020}}, {"b", "c", "d", "f"}),
    ({"year": {"lt": 2020}}, {"a"}),
    ({"year": {"lte": 2020}}, {"a", "b", "f"}),
    ({"year": {"gte": 2020, "lt": 2022}}, {"b", "c", "f"}),
    ({"score": {"gt": 0.5}}, {"b", "c"}),
    ({"score": {"lte": 0}}, {"d"}),
    ({"published": {"gte": "2020-01-01"}}, {"b", "c", "d"}),
    ({"published": {"lt": "2020-07-15"}}, {"a"}),
    ({"published": {"gt": "2020-07-15", "lte": "2021-12-31"}}, {"c"}),
    ({"published": "2021-01-31"}, {"c"}),
    ({"open": True}, {"a", "c"}),
    ({"open": False}, {"b", "d"}),
    ({"open": True, "year": {"gte": 2020}}, {"c"}),
    ({"topic": "food", "year": 2021}, {"c"}),
    ({"tags.main": "x"}, {"f"}),
    ({"topic": "astronomy"}, set()),
    ({"nosuchfield": 1}, set()),
    ({"nosuchfield": {"gte": 0}}, set()),
]


@pytest.mark.parametrize(("raw", "expected"), CASES, ids=[str(raw) for raw, _ in CASES])
def test_filter_selects_exactly_the_matching_documents(
    filtered: DocumentStore, raw: dict[str, Any], expected: set[str]
) -> None:
    assert_selects(filtered, raw, expected)


def assert_selects(filtered: DocumentStore, raw: dict[str, Any], expected: set[str]) -> None:
    """The filter's matching ids, and the dense and keyword searches restricted to them, are `expected`."""
    metadata_filter = parse_filters(raw)
    assert metadata_filter is not None
    assert filtered.matching_document_ids("c", metadata_filter) == expected
    dense = filtered.vector_search("c", unit_vector(7), 10, metadata_filter)
    assert {h.chunk_id for h in dense} == {f"{i}#0" for i in expected}
    keyword = filtered.keyword_search("c", KeywordQuery.of(["common"]), 10, metadata_filter)
    assert {h.chunk_id for h in keyword} == {f"{i}#0" for i in expected}
    multifield = KeywordQuery.of(["common"], scoring="multifield")
    assert {h.chunk_id for h in filtered.keyword_search("c", multifield, 10, metadata_filter)} == {
        f"{i}#0" for i in expected
    }


# List-valued fields (a Markdown note's front matter `tags: [antelope, africa]`): a condition holds when the
# value passes it or, for a list, when one of its elements does; a field's range bounds hold on one element.
TAGGED: dict[str, dict[str, Any]] = {
    "kudu": {"tags": ["antelope", "africa"], "authors": ["Ann", "Bo"], "years": [2019, 2021]},
    "impala": {"tags": ["antelope"], "authors": ["Bo"], "years": [2018, 2022], "seen": ["2020-03-01"]},
    "lion": {"tags": ["cat", "africa"], "years": 2020, "seen": ["2019-01-01", "2024-06-30"]},
    "scalar": {"tags": "antelope", "years": [2019.0]},
    "empty": {"tags": [], "years": []},
    "nested": {"tags": [["antelope"]], "years": [[2020]]},
    "none": {},
}

TAGGED_CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"tags": "antelope"}, {"kudu", "impala", "scalar"}),
    ({"tags": {"in": ["antelope"]}}, {"kudu", "impala", "scalar"}),
    ({"tags": {"in": ["cat", "africa"]}}, {"kudu", "lion"}),
    ({"tags": "africa", "authors": "Bo"}, {"kudu"}),
    ({"tags": "Antelope"}, set()),  # equality is exact, as on scalars
    ({"years": 2021}, {"kudu"}),
    ({"years": 2019}, {"kudu", "scalar"}),
    ({"years": {"gt": 2020}}, {"kudu", "impala"}),
    ({"years": {"gte": 2019, "lt": 2021}}, {"kudu", "lion", "scalar"}),
    # Both bounds on one element: impala's 2018 and 2022 are each outside 2019-2021.
    ({"years": {"gt": 2018, "lt": 2022}}, {"kudu", "lion", "scalar"}),
    ({"seen": {"gte": "2020-01-01"}}, {"impala", "lion"}),
    ({"seen": {"gte": "2020-01-01", "lt": "2024-01-01"}}, {"impala"}),
    ({"years": {"in": [2020]}}, {"lion"}),  # one level of list only: [[2020]] holds a list, not 2020
]


@pytest.fixture
def tagged(store: DocumentStore) -> DocumentStore:
    new_collection(store)
    store.upsert_documents("c", [document(i, [f"common {i}word"], metadata=m) for i, m in TAGGED.items()])
    return store


@pytest.mark.parametrize(("raw", "expected"), TAGGED_CASES, ids=[str(raw) for raw, _ in TAGGED_CASES])
def test_a_list_field_matches_when_one_of_its_elements_does(
    tagged: DocumentStore, raw: dict[str, Any], expected: set[str]
) -> None:
    assert_selects(tagged, raw, expected)


def test_filtered_dense_search_fills_top_k_from_the_matching_documents(filtered: DocumentStore) -> None:
    metadata_filter = parse_filters({"year": {"gte": 2019}})
    assert metadata_filter is not None
    query = unit_vector(11)
    everything = filtered.vector_search("c", query, 10)
    allowed = {"a#0", "b#0", "c#0", "d#0", "f#0"}
    expected = [h for h in everything if h.chunk_id in allowed][:3]
    hits = filtered.vector_search("c", query, 3, metadata_filter)
    assert [h.chunk_id for h in hits] == [h.chunk_id for h in expected]
    assert [h.score for h in hits] == pytest.approx([h.score for h in expected], abs=1e-5)


def test_filtered_keyword_scores_are_the_unfiltered_scores(filtered: DocumentStore) -> None:
    metadata_filter = parse_filters({"topic": "geology"})
    query = KeywordQuery.of(["common", "bword"])
    everything = {h.chunk_id: h.score for h in filtered.keyword_search("c", query, 10)}
    hits = filtered.keyword_search("c", query, 10, metadata_filter)
    assert {h.chunk_id: h.score for h in hits} == {
        k: pytest.approx(everything[k], rel=1e-6) for k in ("b#0", "d#0")
    }


def test_unknown_fields_are_those_no_document_has(filtered: DocumentStore) -> None:
    fields = ["year", "nosuchfield", "tags.main", "published", "tags", "Topic"]
    assert filtered.unknown_fields("c", fields) == ["nosuchfield", "tags", "Topic"]
    assert filtered.unknown_fields("c", []) == []

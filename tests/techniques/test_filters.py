"""options.filters: parsing, malformed filters, and the dense leg (rag_basic) honouring them."""

from typing import Any

import pytest

from iris_rag.errors import InvalidParametersError
from iris_rag.service import RagService
from iris_rag.stores.filters import parse_filters
from tests.conftest import ask


@pytest.mark.parametrize(
    "bad",
    [
        {"year": {"between": [1, 2]}},
        {"year": {}},
        {"year": {"gte": "last tuesday"}},
        {"year": {"gte": True}},
        {"year": {"in": []}},
        {"year": [2019, 2020]},
        {"bad field!": 1},
    ],
)
def test_malformed_filters_are_invalid_parameters(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidParametersError):
        parse_filters(bad)


def test_schema_rejects_malformed_filters_before_the_pipeline(loaded_service: RagService) -> None:
    with pytest.raises(InvalidParametersError):
        ask(loaded_service, "x", options={"filters": {"year": {"between": [1, 2]}}})
    with pytest.raises(InvalidParametersError, match="ISO 8601"):
        ask(loaded_service, "x", options={"filters": {"year": {"gte": "soon"}}})


def test_basic_filters_inside_retrieval(loaded_service: RagService) -> None:
    # The best match overall is filtered out, yet top_k results still come back from what passes.
    result = ask(
        loaded_service, "aspirin heart attack", options={"top_k": 2, "filters": {"year": {"gte": 2020}}}
    )
    assert [d["id"] for d in result["retrieved_documents"]] == ["sourdough", "volcano"] or {
        d["id"] for d in result["retrieved_documents"]
    } == {"sourdough", "volcano"}
    assert result["metadata"]["filters"]["matched_documents"] == 2
    cardiology = ask(loaded_service, "lava", options={"filters": {"topic": "cardiology"}})
    assert [d["id"] for d in cardiology["retrieved_documents"]] == ["aspirin"]
    nothing = ask(loaded_service, "lava", options={"filters": {"shelf": 3}})
    assert nothing["retrieved_documents"] == []
    assert nothing["metadata"]["filters"]["unknown_fields"] == ["shelf"]
    assert "Nothing relevant" in nothing["answer"]


def test_an_empty_answer_says_why_nothing_came_back(loaded_service: RagService) -> None:
    """No document passed the filters, or no passage reached min_similarity: the answer says which."""
    for filters, reason in [
        ({"year": 1999}, "no document matches options.filters"),
        ({"yeer": 2020}, "no document has yeer in its metadata"),
    ]:
        answer = str(ask(loaded_service, "aspirin", options={"filters": filters})["answer"])
        assert answer.startswith("Nothing relevant was found") and reason in answer
        assert "similarity threshold" not in answer and "min_similarity" not in answer
    strict = str(ask(loaded_service, "aspirin", options={"min_similarity": 0.99})["answer"])
    assert "no retrieved passage reached min_similarity 0.99" in strict

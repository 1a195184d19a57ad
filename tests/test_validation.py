"""Bad input gets the right code from the worker too (the front end checks the same schemas first)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field, model_validator
from pydantic import ValidationError as PydanticError

from iris_rag.errors import (
    InvalidParametersError,
    InvalidQueryError,
    MissingRequiredFieldError,
    PipelineNotFoundError,
)
from iris_rag.validation import model_errors, validate_arguments

BAD_QUERIES = ["", "   \n\t ", "x" * 2049]
BAD_OPTIONS: list[dict[str, Any]] = [
    {"top_k": 0},
    {"top_k": 51},
    {"top_k": "5"},
    {"min_similarity": 1.5},
    {"temperature": -1},
    {"unknown_key": 1},
]


@pytest.mark.parametrize("query", BAD_QUERIES)
def test_bad_queries_are_invalid_query(query: str) -> None:
    with pytest.raises(InvalidQueryError, match="rag_basic"):
        validate_arguments("rag_basic", {"query": query})


def test_missing_query_is_missing_required_field() -> None:
    with pytest.raises(MissingRequiredFieldError, match="'query' is a required property"):
        validate_arguments("rag_basic", {})


@pytest.mark.parametrize("options", BAD_OPTIONS)
def test_bad_options_are_invalid_parameters(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidParametersError, match="/options"):
        validate_arguments("rag_basic", {"query": "fine", "options": options})


def test_every_error_is_reported() -> None:
    with pytest.raises(InvalidParametersError) as failure:
        validate_arguments("rag_basic", {"query": "ok", "options": {"top_k": 0, "max_tokens": 0}})
    assert len(failure.value.details["errors"]) == 2


def test_valid_arguments_pass_and_unknown_tool_fails() -> None:
    arguments = {"query": "x" * 2048, "collection_id": "a.b-c_1", "options": {"top_k": 50, "generate": False}}
    assert validate_arguments("rag_basic", arguments) == arguments
    with pytest.raises(InvalidParametersError):
        validate_arguments("rag_basic", {"query": "q", "collection_id": "../etc"})
    with pytest.raises(PipelineNotFoundError):
        validate_arguments("rag_nothing", {})


def test_a_parameter_models_errors_read_as_the_schemas_do() -> None:
    class Params(BaseModel):
        top: int = Field(1, ge=1)

        @model_validator(mode="after")
        def _odd(self) -> Params:
            if self.top == 2:
                msg = "top cannot be 2"
                raise ValueError(msg)
            return self

    with pytest.raises(PydanticError) as field_error:
        Params.model_validate({"top": 0})
    assert model_errors(field_error.value) == ["/top: Input should be greater than or equal to 1"]
    with pytest.raises(PydanticError) as whole:
        Params.model_validate({"top": 2})
    assert model_errors(whole.value) == ["top cannot be 2"]

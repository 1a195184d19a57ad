"""rag_smart_questions: real questions, each checked to retrieve its source chunk; LLM and extractive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.embedder import Embedder
from iris_rag.errors import CollectionNotFoundError, InvalidParametersError, PipelineNotFoundError
from iris_rag.questions import VERIFY_TOP_K, SmartQuestionsRequest, parse_llm_questions, pattern_question
from iris_rag.schemas import CORRELATION_FIELDS, tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import DOCUMENTS, SAMPLE_CORPUS
from tests.fake_openai import FakeOpenAIServer

# Enough other passages that retrieving a question is a real test of it (with three, every chunk is top 5).
SAMPLE_DOCUMENTS = 60
TECHNIQUES = "basic,hybrid_ifind"


def sample_documents(count: int) -> list[dict[str, Any]]:
    """The first documents of the bundled SciFact sample, as rag_ingest takes them."""
    documents = []
    with SAMPLE_CORPUS.open(encoding="utf-8") as lines:
        for line, _ in zip(lines, range(count), strict=False):
            row = json.loads(line)
            documents.append({"id": row["_id"], "title": row["title"], "content": row["text"]})
    return documents


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("questions")


@pytest.fixture(scope="module")
def loaded(data_dir: Path, embedder: Embedder) -> Iterator[RagService]:
    """A service whose collection 'docs' holds the three DOCUMENTS among 60 SciFact abstracts."""
    service = RagService(Settings(RAG_DATA_DIR=data_dir, RAG_TECHNIQUES=TECHNIQUES), embedder=embedder)
    result = service.ingest(
        {"collection_id": "docs", "documents": DOCUMENTS + sample_documents(SAMPLE_DOCUMENTS)}
    )
    assert result["ingested_count"] == 3 + SAMPLE_DOCUMENTS
    yield service
    service.close()


QUESTION_WORDS = (
    "What ",
    "How ",
    "Why ",
    "Which ",
    "When ",
    "Where ",
    "Who ",
    "Does ",
    "Is ",
    "Are ",
    "Can ",
)


@pytest.mark.parametrize(
    ("sentence", "question"),
    [
        (
            "Daily low-dose aspirin reduces the risk of a first heart attack in older adults.",
            "What is the effect of daily low-dose aspirin on the risk of a first heart attack in older "
            "adults?",
        ),
        (
            "Sourdough bread rises because wild yeast and lactic acid bacteria ferment the dough.",
            "What explains why sourdough bread rises?",
        ),
        (
            "We found that obesity was strongly associated with insulin resistance, as reported before.",
            "What is the relationship between obesity and insulin resistance?",
        ),
        ("Basalt is a volcanic rock that cools quickly.", "What is basalt?"),
        # A pronoun subject means nothing on its own: no pattern question from it.
        ("It also raises the risk of bleeding in the stomach.", None),
        ("Does aspirin help?", None),
    ],
)
def test_pattern_questions_are_whole_questions(sentence: str, question: str | None) -> None:
    assert pattern_question(sentence) == question


def _check_questions(service: RagService, result: dict[str, object], count: int) -> None:
    questions = result["questions"]
    assert isinstance(questions, list) and 0 < len(questions) <= count
    for item in questions:
        assert item["question"].endswith("?") and item["question"].startswith(QUESTION_WORDS), item
        # Not a sentence with a question mark on it: the evidence sentence itself is never the question.
        assert item["question"].rstrip("?") not in item["evidence"]
        # Checked: the question, retrieved now, brings its source chunk back in the top k.
        found = service.execute(
            {
                "technique": result["retriever"],
                "arguments": {
                    "query": item["question"],
                    "collection_id": "docs",
                    "options": {"top_k": VERIFY_TOP_K, "generate": False},
                },
            }
        )
        ranked = [d["chunk_id"] for d in found["retrieved_documents"]]
        assert item["chunk_ids"][0] in ranked
        assert ranked.index(item["chunk_ids"][0]) + 1 == item["retrieval_rank"]


def test_extractive_questions_are_checked_against_retrieval(loaded: RagService) -> None:
    result = loaded.smart_questions(
        {"context": "Tell me about heart attacks and aspirin.", "collection_id": "docs", "count": 3}
    )
    assert result["method"] == "extractive" and "no LLM" in result["method_note"]
    assert result["retriever"] == "hybrid_ifind" and result["verify_top_k"] == VERIFY_TOP_K
    _check_questions(loaded, result, 3)
    assert result["candidates_checked"] == len(result["questions"]) + result["candidates_rejected"]
    # The question the context already asks is no follow-up; the new one is about the bleeding risk.
    assert any("bleeding" in q["question"] or "stomach" in q["question"] for q in result["questions"])


def test_count_is_respected_and_bad_input_is_refused(loaded: RagService) -> None:
    result = loaded.smart_questions(
        {"context": "volcanoes, bread and aspirin", "count": 1, "collection_id": "docs"}
    )
    assert len(result["questions"]) == 1
    with pytest.raises(InvalidParametersError):
        loaded.smart_questions({"context": "x", "count": 11})
    with pytest.raises(InvalidParametersError):
        loaded.smart_questions({"context": "   "})
    with pytest.raises(CollectionNotFoundError):
        loaded.smart_questions({"context": "aspirin", "collection_id": "nowhere"})


def test_llm_questions_keep_only_those_that_retrieve_their_passage(
    loaded: RagService, data_dir: Path, embedder: Embedder
) -> None:
    server = FakeOpenAIServer(
        reply=(
            "Here are the questions:\n"
            "1. Why does a longer fermentation make sourdough taste more sour? [1]\n"
            "2. What makes explosive volcanic eruptions happen? [1]\n"  # cites the wrong passage
            "3. How does this one cite nothing?\n"
            "4. Which passage is number forty? [40]\n"
        )
    )
    settings = Settings(
        RAG_DATA_DIR=data_dir,
        RAG_TECHNIQUES=TECHNIQUES,
        **server.llm_settings(),
    )
    service = RagService(settings, embedder=embedder)
    try:
        result = service.smart_questions({"context": "How is sourdough made?", "collection_id": "docs"})
        assert result["method"] == "llm"
        assert [q["question"] for q in result["questions"]] == [
            "Why does a longer fermentation make sourdough taste more sour?"
        ]
        assert result["questions"][0]["document_id"] == "sourdough"
        assert result["candidates_rejected"] == 1  # the volcano question does not retrieve the bread passage
        prompt = server.requests[-1]["body"]["messages"][1]["content"]
        assert "How is sourdough made?" in prompt and '<passage id="1" title="Baking sourdough">' in prompt

        server.status = 500  # a failing LLM: extractive questions, and the response says why
        fallback = service.smart_questions({"context": "How is sourdough made?", "collection_id": "docs"})
        assert fallback["method"] == "extractive" and "llm_error" in fallback
        assert fallback["questions"]
    finally:
        service.close()
        server.close()


def test_an_llm_question_citing_a_number_too_long_for_int_is_skipped() -> None:
    reply = "1. What does the passage say about rivers? [" + "9" * 5000 + "]\n"
    assert parse_llm_questions(reply, []) == []


def test_a_retriever_is_needed(tmp_path: Path, embedder: Embedder) -> None:
    service = RagService(Settings(RAG_DATA_DIR=tmp_path, RAG_TECHNIQUES="sqlrag"), embedder=embedder)
    try:
        with pytest.raises(PipelineNotFoundError, match="passage-retrieving technique"):
            service.smart_questions({"context": "aspirin"})
    finally:
        service.close()


def assert_model_mirrors_schema(tool: str, model: type[Any], defaults_only_in_model: set[str]) -> None:
    """The tool's JSON Schema (what clients see and both sides validate) and its pydantic model agree."""
    spec = tool_spec(tool)
    assert spec is not None
    # request_id and session_id are on every tool and belong to the call (the service drops them).
    properties = {k: v for k, v in spec["inputSchema"]["properties"].items() if k not in CORRELATION_FIELDS}
    parsed = model.model_json_schema()
    assert set(properties) == set(parsed["properties"]), tool
    assert set(spec["inputSchema"]["required"]) == set(parsed.get("required", [])), tool
    for name, field in properties.items():
        mirrored = parsed["properties"][name]
        mirrored = next((b for b in mirrored.get("anyOf", []) if b.get("type") != "null"), mirrored)
        for key in ("type", "minimum", "maximum", "minLength", "maxLength"):
            if key in field or key in mirrored:
                assert field.get(key) == mirrored.get(key), (tool, name, key)
        if name not in defaults_only_in_model:
            assert field.get("default") == parsed["properties"][name].get("default"), (tool, name)


def test_the_request_model_mirrors_the_schema() -> None:
    # count's default (5) is left out of the listed schema to keep tools/list small; the model applies it.
    assert_model_mirrors_schema("rag_smart_questions", SmartQuestionsRequest, {"count"})
    assert SmartQuestionsRequest(context="x").count == 5

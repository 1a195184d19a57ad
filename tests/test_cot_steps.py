"""options.cot_steps: the steps from the evidence to the answer, each citing chunk ids.

Without an LLM, the extractive answer's evidence chain, labelled as such; with one (FakeOpenAIServer, a test
double for a hosted LLM), the LLM's own steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError
from iris_rag.generation import EXTRACTIVE_STEPS_NOTE, LLM_NO_STEPS_NOTE, Passage, parse_llm_steps
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.sqlrag.pipeline import SQL_CHUNK_ID
from tests.conftest import DOCUMENTS, ask
from tests.fake_openai import FakeOpenAIServer
from tests.techniques.sqlrag.test_pipeline import TOTALS, load_tables


def validate_technique_response(result: dict[str, Any]) -> None:
    """The result conforms to the technique tools' full output schema (cot_steps included)."""
    spec = tool_spec("rag_basic")
    assert spec is not None
    Draft202012Validator(spec["outputSchema"]).validate(result)


def _chunk_ids(result: dict[str, Any]) -> set[str]:
    return {d["chunk_id"] for d in result["retrieved_documents"]}


# Without an LLM: the extractive evidence chain
def test_extractive_steps_are_the_evidence_chain_labelled_as_such(loaded_service: RagService) -> None:
    result = ask(loaded_service, "Does aspirin reduce heart attacks?", options={"cot_steps": True})
    steps = result["cot_steps"]
    assert steps["source"] == "extractive"
    assert steps["note"] == EXTRACTIVE_STEPS_NOTE
    assert "not reasoning by a model" in steps["note"]
    chain = steps["steps"]
    assert [s["step"] for s in chain] == list(range(1, len(chain) + 1))
    # First what was searched (every retrieved chunk), last how the answer is made, between them each
    # quoted sentence with the chunk it came from and the query terms it shares.
    assert set(chain[0]["chunk_ids"]) == _chunk_ids(result)
    quoted = chain[1:-1]
    assert len(quoted) == result["answer"].count("\n- ")
    assert quoted[0]["chunk_ids"] == ["aspirin#0"]
    assert "aspirin" in quoted[0]["text"] and "Daily low-dose aspirin" in quoted[0]["text"]
    assert chain[-1]["text"].startswith(f"The answer quotes {len(quoted)} sentence")
    assert {i for s in quoted for i in s["chunk_ids"]} == set(chain[-1]["chunk_ids"])
    assert all(set(s["chunk_ids"]) <= _chunk_ids(result) for s in chain)


def test_no_steps_unless_asked_and_the_answer_is_unchanged(loaded_service: RagService) -> None:
    plain = ask(loaded_service, "Does aspirin reduce heart attacks?")
    with_steps = ask(loaded_service, "Does aspirin reduce heart attacks?", options={"cot_steps": True})
    assert "cot_steps" not in plain
    assert with_steps["answer"] == plain["answer"]


def test_an_off_topic_question_has_one_step_saying_why_nothing_is_quoted(loaded_service: RagService) -> None:
    result = ask(loaded_service, "Who won the 1998 football world cup?", options={"cot_steps": True})
    (step,) = result["cot_steps"]["steps"]
    assert "below the floor" in step["text"]
    assert len(step["chunk_ids"]) == 1 and step["chunk_ids"][0] in _chunk_ids(result)


def test_every_technique_gives_steps(loaded_service: RagService) -> None:
    from iris_rag.techniques.registry import PIPELINES

    for technique in sorted(PIPELINES):
        arguments = {
            "query": "Why does sourdough rise?",
            "collection_id": "docs",
            "options": {"cot_steps": True},
        }
        result = loaded_service.execute({"technique": technique, "arguments": arguments})
        validate_technique_response(result)
        assert result["cot_steps"]["source"] == "extractive", technique
        quoted = result["cot_steps"]["steps"][-1]["chunk_ids"]
        assert quoted and set(quoted) <= _chunk_ids(result), technique
        assert any(i.startswith("sourdough#") for i in quoted), technique


def test_sqlrag_steps_start_from_the_rows(service: RagService) -> None:
    load_tables(service)
    arguments = {
        "query": "Which region sold the most?",
        "collection_id": "docs",
        "options": {"cot_steps": True},
        "technique_params": {"sql": TOTALS},
    }
    result = service.execute({"technique": "sqlrag", "arguments": arguments})
    chain = result["cot_steps"]["steps"]
    assert result["cot_steps"]["source"] == "extractive"
    assert chain[0]["chunk_ids"] == [SQL_CHUNK_ID] and "rows" in chain[0]["text"]
    # Then the passages' chain: here no passage is about sales, and the step says why nothing is quoted.
    assert "below the floor" in chain[1]["text"]
    validate_technique_response(result)


def test_steps_without_an_answer_are_invalid_parameters(loaded_service: RagService) -> None:
    with pytest.raises(InvalidParametersError, match="cot_steps needs generate"):
        ask(loaded_service, "aspirin", options={"cot_steps": True, "generate": False})


# With an LLM (FakeOpenAIServer, a test double)
@pytest.fixture
def fake_llm() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    yield server
    server.close()


@pytest.fixture
def llm_service(tmp_path: Path, embedder: Embedder, fake_llm: FakeOpenAIServer) -> Iterator[RagService]:
    settings = Settings(
        RAG_DATA_DIR=tmp_path,
        LLM_PROVIDER="openai",
        LLM_MODEL="fake-model",
        LLM_API_KEY="sk-test-secret",
        LLM_BASE_URL=fake_llm.base_url,
        LLM_MAX_RETRIES=0,
    )
    service = RagService(settings, embedder=embedder)
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS})
    yield service
    service.close()


LLM_REPLY = (
    "Aspirin lowers the risk of a first heart attack [1], at the cost of bleeding.\n\n"
    "**Steps:**\n"
    "1. The aspirin passage says low-dose aspirin reduces first heart attacks {aspirin#0}\n"
    "2. It also names stomach bleeding as the cost [1]\n"
    "3. So the benefit comes with a risk {aspirin#0, invented#7}\n"
)


def test_llm_steps_cite_the_chunks_it_was_given(llm_service: RagService, fake_llm: FakeOpenAIServer) -> None:
    fake_llm.reply = LLM_REPLY
    result = ask(llm_service, "Does aspirin prevent heart attacks?", options={"cot_steps": True, "top_k": 2})
    assert result["answer"] == "Aspirin lowers the risk of a first heart attack [1], at the cost of bleeding."
    steps = result["cot_steps"]
    assert steps["source"] == "llm"
    assert [s["chunk_ids"] for s in steps["steps"]] == [["aspirin#0"], ["aspirin#0"], ["aspirin#0"]]
    assert (
        steps["steps"][0]["text"] == "The aspirin passage says low-dose aspirin reduces first heart attacks"
    )
    assert "invented#7" not in str(steps)  # an id the LLM was not given is dropped
    body = fake_llm.requests[-1]["body"]
    assert "Steps:" in body["messages"][0]["content"]
    assert (
        '<passage id="1" title="Aspirin and heart attacks" chunk="aspirin#0">'
        in body["messages"][1]["content"]
    )
    validate_technique_response(result)


def test_llm_prompt_is_unchanged_without_steps(llm_service: RagService, fake_llm: FakeOpenAIServer) -> None:
    result = ask(llm_service, "Does aspirin prevent heart attacks?")
    assert "cot_steps" not in result and result["answer"] == fake_llm.reply
    body = fake_llm.requests[-1]["body"]
    assert "Steps:" not in body["messages"][0]["content"]
    assert "{aspirin#0}" not in body["messages"][1]["content"]


def test_an_llm_that_writes_no_steps_says_so(llm_service: RagService, fake_llm: FakeOpenAIServer) -> None:
    result = ask(llm_service, "Does aspirin prevent heart attacks?", options={"cot_steps": True})
    assert result["answer"] == fake_llm.reply
    assert result["cot_steps"] == {"source": "llm", "note": LLM_NO_STEPS_NOTE, "steps": []}


def test_parse_takes_the_last_steps_heading_and_numbered_or_bulleted_lines() -> None:
    passages = [
        Passage(1, "d1", "T1", "x", 0.9, chunk_id="d1#0"),
        Passage(1, "d1", "T1", "y", 0.8, chunk_id="d1#1"),
        Passage(2, "d2", "T2", "z", 0.7, chunk_id="d2#0"),
    ]
    answer, reasoning = parse_llm_steps("Answer.\nSteps:\n- first [1]\n\n2) second [2] {d1#1}\n", passages)
    assert answer == "Answer."
    assert [(s.text, s.chunk_ids) for s in reasoning.steps] == [
        ("first [1]", ("d1#0", "d1#1")),
        ("second [2]", ("d1#1", "d2#0")),
    ]


def test_a_step_citing_a_passage_right_after_a_word_cites_it() -> None:
    passages = [
        Passage(1, "d1", "T1", "x", 0.9, chunk_id="d1#0"),
        Passage(2, "d2", "T2", "z", 0.7, chunk_id="d2#0"),
    ]
    _, reasoning = parse_llm_steps(
        "Answer.\nSteps:\n1. read the dose[2].\n2. items[1].name is code\n", passages
    )
    assert [s.chunk_ids for s in reasoning.steps] == [("d2#0",), ()]


def test_a_step_citing_a_number_too_long_for_int_is_a_step_citing_nothing() -> None:
    passages = [Passage(1, "d1", "T1", "x", 0.9, chunk_id="d1#0")]
    _, reasoning = parse_llm_steps("Answer.\nSteps:\n1. read [" + "9" * 5000 + "] and `a[1]`\n", passages)
    assert [s.chunk_ids for s in reasoning.steps] == [()]

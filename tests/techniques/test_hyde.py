"""rag_hyde on a real store and model: PRF feedback vector, LLM hypothesis, every parameter, filters.

The only test double is FakeOpenAIServer: a hosted OpenAI-compatible LLM cannot run here, so a loopback
server that speaks the real HTTP API stands in for it.
"""

import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iris_rag.cancellation import CancelToken, cancellation_scope
from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError, RequestCancelledError
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.hyde import (
    HYPOTHESIS_PROMPT,
    QUERY_TIME_BATCH,
    SEGMENT_TOKENS,
    HydeParams,
    combined_vector,
)
from tests.conftest import DOCUMENTS
from tests.fake_openai import FakeOpenAIServer

EXTRA = [
    {
        "id": "ulcer",
        "title": "Stomach ulcers",
        "content": "Stomach ulcers often bleed. Painkillers such as ibuprofen and naproxen damage the "
        "stomach lining and cause bleeding. Proton pump inhibitors protect the lining.",
        "metadata": {"year": 2022, "topic": "gastroenterology"},
    },
    {
        "id": "statins",
        "title": "Statins",
        "content": "Statins lower LDL cholesterol. Lower cholesterol means fewer heart attacks and strokes. "
        "Muscle pain is the most common side effect.",
        "metadata": {"year": 2017, "topic": "cardiology"},
    },
]
# A long LLM reply: 30 sentences of about 12 word pieces each.
LONG_REPLY = " ".join(
    f"Finding {n}: basaltic volcanoes erupt runny lava that flows for many kilometres." for n in range(1, 31)
)


@pytest.fixture
def hyde_service(service: RagService) -> RagService:
    result = service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    assert result["ingested_count"] == 5
    return service


def hyde(
    service: RagService, query: str, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "query": query,
        "collection_id": "docs",
        "technique_params": params or {},
        "options": {"generate": False, **options},
    }
    return service.execute({"technique": "hyde", "arguments": arguments})


def ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


def specific(result: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = result["metadata"]["technique_specific"]
    return spec


def basic(service: RagService, query: str, **options: Any) -> dict[str, Any]:
    return service.execute(
        {
            "technique": "basic",
            "arguments": {"query": query, "collection_id": "docs", "options": {"generate": False, **options}},
        }
    )


def test_schema_and_parameter_model_agree() -> None:
    """The tool's JSON Schema (what MCP clients see and the worker validates) matches HydeParams."""
    spec = tool_spec("rag_hyde")
    assert spec is not None
    schema = spec["inputSchema"]["properties"]["technique_params"]
    assert schema["additionalProperties"] is False
    model = HydeParams.model_json_schema()["properties"]
    assert set(schema["properties"]) == set(model) == set(HydeParams.model_fields)
    for name, declared in schema["properties"].items():
        for key in ("type", "minimum", "maximum", "enum", "default"):
            assert declared.get(key) == model[name].get(key), (name, key)
    # The ranges and defaults.
    properties = schema["properties"]
    assert properties["generate_hypothetical"]["default"] is True
    assert (properties["hypothesis_length"]["minimum"], properties["hypothesis_length"]["maximum"]) == (
        50,
        500,
    )
    assert properties["hypothesis_length"]["default"] == 200
    assert properties["combine_strategy"]["enum"] == ["auto", "replace", "combine", "weighted"]
    assert properties["combine_strategy"]["default"] == "auto"


@pytest.mark.parametrize(
    "params",
    [
        {"hypothesis_length": 49},
        {"hypothesis_length": 501},
        {"combine_strategy": "max"},
        {"hypothesis_weight": 1.5},
        {"prf_depth": 0},
        {"generate_hypothetical": "no"},
        {"unknown": 1},
    ],
)
def test_out_of_range_parameters_are_invalid(service: RagService, params: dict[str, Any]) -> None:
    # Rejected before any collection is looked up (the schema, then the parameter model).
    with pytest.raises(InvalidParametersError):
        hyde(service, "stomach bleeding", params)


def test_without_hypothesis_it_is_plain_dense_search(hyde_service: RagService) -> None:
    result = hyde(hyde_service, "heart attack prevention", {"generate_hypothetical": False}, top_k=5)
    spec = specific(result)
    assert spec["hypothesis"] is None and spec["hypothesis_source"] == "none"
    plain = basic(hyde_service, "heart attack prevention", top_k=5)
    assert ids(result) == ids(plain)
    assert [d["similarity_score"] for d in result["retrieved_documents"]] == [
        d["similarity_score"] for d in plain["retrieved_documents"]
    ]


def hybrid(service: RagService, query: str, **options: Any) -> dict[str, Any]:
    return service.execute(
        {
            "technique": "hybrid_ifind",
            "arguments": {"query": query, "collection_id": "docs", "options": {"generate": False, **options}},
        }
    )


def test_prf_feedback_vector_without_llm(hyde_service: RagService) -> None:
    result = hyde(hyde_service, "heart attack prevention", top_k=5)
    spec = specific(result)
    assert spec["hypothesis_source"] == "prf"
    # auto without an LLM: the feedback vector is mixed in at hypothesis_weight (0.4), not used alone.
    assert spec["generate_hypothetical"] is True and spec["combine_strategy"] == "weighted"
    first = hybrid(hyde_service, "heart attack prevention", top_k=1)  # prf_depth's default
    assert spec["prf_first_pass"] == "rag_hybrid_ifind" and spec["prf_documents"] == ids(first)
    # No text is embedded: the hypothesis is the mean of the first pass's stored chunk vectors.
    assert (
        spec["hypothesis"] is None and "hypothesis_tokens" not in spec and "hypothesis_segments" not in spec
    )
    assert spec["prf_chunks"] == [d["chunk_id"] for d in first["retrieved_documents"]]
    assert spec["hypothesis_weight"] == 0.4
    replaced = hyde(hyde_service, "heart attack prevention", {"combine_strategy": "replace"}, top_k=5)
    # replace: the hypothesis vector alone ranks, so the score is the cosine to the hypothesis.
    for document in replaced["retrieved_documents"]:
        assert document["similarity_score"] == pytest.approx(
            document["score_details"]["hypothesis_cosine"], abs=1e-5
        )
    assert specific(replaced)["hypothesis_weight"] == 1.0


def test_the_feedback_comes_from_the_hybrid_first_pass(hyde_service: RagService) -> None:
    """The keyword leg finds what the dense leg misses ("ibuprofen" is in one document only), and the
    feedback is that chunk: rag_hybrid_ifind's top chunk, not rag_basic's (SciFact train: 0.728 nDCG@10
    from the hybrid first pass against 0.681 from the dense one)."""
    query = "ibuprofen and heart disease"
    dense_top = basic(hyde_service, query, top_k=3)["retrieved_documents"][0]
    hybrid_top = hybrid(hyde_service, query, top_k=3)["retrieved_documents"][0]
    assert dense_top["id"] != hybrid_top["id"]  # the case this test is about
    spec = specific(hyde(hyde_service, query, {"combine_strategy": "replace"}, top_k=3))
    assert spec["prf_chunks"] == [hybrid_top["chunk_id"]] and spec["prf_documents"] == [hybrid_top["id"]]
    deeper = specific(hyde(hyde_service, query, {"prf_depth": 3}, top_k=3))
    ranked = hybrid(hyde_service, query, top_k=3)["retrieved_documents"]
    assert deeper["prf_chunks"] == [d["chunk_id"] for d in ranked]


def test_prf_hypothesis_is_the_mean_of_the_stored_chunk_vectors(hyde_service: RagService) -> None:
    """Checked against the store's own vectors: the cosine of each result to the hypothesis."""
    import numpy as np

    service = hyde_service
    result = hyde(service, "stomach bleeding", {"prf_depth": 3, "combine_strategy": "replace"}, top_k=5)
    spec = specific(result)
    assert len(spec["prf_chunks"]) == 3
    store = service.store
    collection = store.get_collection("docs")
    assert collection is not None
    stored = store.chunk_vectors(collection.id, spec["prf_chunks"])
    mean = np.mean([v / np.linalg.norm(v) for v in stored.values()], axis=0)
    mean /= np.linalg.norm(mean)
    documents = result["retrieved_documents"]
    vectors = store.chunk_vectors(collection.id, [d["chunk_id"] for d in documents])
    for document in documents:
        vector = vectors[document["chunk_id"]]
        expected = float(vector @ mean / np.linalg.norm(vector))
        assert document["score_details"]["hypothesis_cosine"] == pytest.approx(expected, abs=1e-5)
    # replace with one feedback chunk: that chunk is its own best match.
    one = hyde(service, "stomach bleeding", {"prf_depth": 1, "combine_strategy": "replace"}, top_k=1)
    assert [d["chunk_id"] for d in one["retrieved_documents"]] == specific(one)["prf_chunks"]


def test_prf_encodes_nothing_but_the_query(hyde_service: RagService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the feedback vector (issue 18): no text of the first pass is encoded per call."""
    embedder = hyde_service.embedder
    calls: list[int] = []
    original = embedder.encode

    def counting(texts: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(texts))
        return original(texts, *args, **kwargs)

    monkeypatch.setattr(embedder, "encode", counting)
    result = hyde(hyde_service, "which painkillers damage the stomach lining?", {"prf_depth": 5})
    assert specific(result)["hypothesis_source"] == "prf" and result["retrieved_documents"]
    assert calls == []


def test_hypothesis_length_does_not_change_the_feedback_vector(hyde_service: RagService) -> None:
    short = hyde(hyde_service, "heart attack risk and bleeding", {"hypothesis_length": 50})
    long = hyde(hyde_service, "heart attack risk and bleeding", {"hypothesis_length": 500})
    assert [d["similarity_score"] for d in short["retrieved_documents"]] == [
        d["similarity_score"] for d in long["retrieved_documents"]
    ]
    with pytest.raises(InvalidParametersError):
        hyde(hyde_service, "x", {"hypothesis_length": 20})


def test_prf_depth_chooses_the_feedback_chunks(hyde_service: RagService) -> None:
    one = hyde(hyde_service, "heart attack risk", {"prf_depth": 1})
    five = hyde(hyde_service, "heart attack risk", {"prf_depth": 5})
    assert len(specific(one)["prf_documents"]) == 1
    assert len(specific(five)["prf_documents"]) == 5
    assert specific(one)["query_hypothesis_cosine"] != specific(five)["query_hypothesis_cosine"]


def _expected(details: dict[str, Any], weight: float, cosine: float) -> float:
    """Cosine to the normalized (1 - w) q + w h, from the document's cosines to q and to h."""
    norm = math.sqrt((1 - weight) ** 2 + weight**2 + 2 * weight * (1 - weight) * cosine)
    return float((1 - weight) * details["query_cosine"] + weight * details["hypothesis_cosine"]) / norm


@pytest.mark.parametrize(
    ("params", "weight"),
    [
        ({"combine_strategy": "replace"}, 1.0),
        ({"combine_strategy": "combine"}, 0.5),
        ({"combine_strategy": "weighted", "hypothesis_weight": 0.2}, 0.2),
        ({"combine_strategy": "weighted", "hypothesis_weight": 0.9}, 0.9),
        ({"combine_strategy": "combine", "hypothesis_weight": 0.9}, 0.5),
    ],
)
def test_combine_strategy_and_weight_set_the_search_vector(
    hyde_service: RagService, params: dict[str, Any], weight: float
) -> None:
    result = hyde(hyde_service, "stomach bleeding", params, top_k=5)
    spec = specific(result)
    assert spec["hypothesis_weight"] == weight
    cosine = spec["query_hypothesis_cosine"]
    for document in result["retrieved_documents"]:
        assert document["similarity_score"] == pytest.approx(
            _expected(document["score_details"], weight, cosine), abs=1e-4
        )


def test_small_query_time_batches_give_the_same_vectors(embedder: Embedder) -> None:
    """The pseudo-document's sentences are encoded QUERY_TIME_BATCH at a time, so that a batch is not
    mostly padding: padding is masked, so the vectors are those of one batch (and so is the ranking)."""
    sentences = [part for document in DOCUMENTS + EXTRA for part in str(document["content"]).split(". ")]
    sentences += ["Short.", " ".join(["A much longer sentence about the stomach lining"] * 8)]
    assert len(sentences) > 2 * QUERY_TIME_BATCH
    one_batch = embedder.encode(sentences, batch_size=len(sentences))
    small = embedder.encode(sentences, batch_size=QUERY_TIME_BATCH)
    assert small.shape == one_batch.shape
    assert float(abs(small - one_batch).max()) < 1e-5


def test_combined_vector_is_unit_length() -> None:
    import numpy as np

    q = np.array([1.0, 0.0], dtype=np.float32)
    h = np.array([0.0, 1.0], dtype=np.float32)
    assert np.allclose(combined_vector(q, h, 0.5), [math.sqrt(0.5), math.sqrt(0.5)])
    assert np.allclose(combined_vector(q, h, 0.0), q) and np.allclose(combined_vector(q, h, 1.0), h)


def test_filters_apply_to_the_feedback_and_the_search(hyde_service: RagService) -> None:
    result = hyde(
        hyde_service, "heart attack", top_k=5, filters={"topic": "cardiology", "year": {"lt": 2019}}
    )
    assert ids(result) == ["statins"]
    assert specific(result)["prf_documents"] == ["statins"]
    assert result["metadata"]["filters"]["matched_documents"] == 1
    nothing = hyde(hyde_service, "heart attack", filters={"colour": "red"})
    assert nothing["retrieved_documents"] == [] and specific(nothing)["prf_chunks"] == []
    assert "note" in specific(nothing)


def test_generate_false_and_true(hyde_service: RagService) -> None:
    evidence = hyde(hyde_service, "stomach bleeding")
    assert evidence["answer"] is None and evidence["retrieved_documents"]
    answered = hyde(hyde_service, "stomach bleeding", generate=True)
    assert answered["answer"] and "[1]" in answered["answer"]


# --- LLM path ---------------------------------------------------------------------------------------------
@pytest.fixture
def llm_service(tmp_path: Path, embedder: Embedder) -> Iterator[tuple[RagService, FakeOpenAIServer]]:
    server = FakeOpenAIServer(reply="Passage: " + LONG_REPLY)
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "llm",
        LLM_PROVIDER="openai",
        LLM_MODEL="fake-model",
        LLM_API_KEY="sk-test",
        LLM_BASE_URL=server.base_url,
        LLM_MAX_RETRIES=0,
    )
    service = RagService(settings, embedder=embedder)
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    yield service, server
    service.close()
    server.close()


def _hypothesis_requests(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    # Ingest asked the same server for graph extraction; the hypothesis is the request with our prompt.
    return [r["body"] for r in server.requests if r["body"]["messages"][0]["content"] == HYPOTHESIS_PROMPT]


def test_llm_writes_the_hypothesis(llm_service: tuple[RagService, FakeOpenAIServer]) -> None:
    service, server = llm_service
    # The query says nothing about volcanoes and dense search alone ranks the aspirin text first; the
    # LLM's passage is about lava, and the search follows it.
    query = "what is dangerous?"
    assert ids(basic(service, query, top_k=3))[0] != "volcano"
    result = hyde(service, query, {"hypothesis_length": 100}, top_k=3)
    spec = specific(result)
    assert spec["hypothesis_source"] == "llm" and "llm_error" not in spec
    assert spec["hypothesis"].startswith("Finding 1: basaltic volcanoes")  # label stripped
    assert LONG_REPLY.startswith(spec["hypothesis"]), "cut at a sentence boundary of the LLM's text"
    assert 0 < spec["hypothesis_tokens"] <= 100 and spec["hypothesis_segments"] == 1
    assert "prf_documents" not in spec
    assert ids(result)[0] == "volcano"
    for document in result["retrieved_documents"]:  # replace: the hypothesis embedding alone ranks
        assert document["similarity_score"] == pytest.approx(
            document["score_details"]["hypothesis_cosine"], abs=1e-5
        )
    (request,) = _hypothesis_requests(server)
    assert request["model"] == "fake-model"
    assert request["max_tokens"] == 125
    assert query in request["messages"][1]["content"]
    assert "about 75 words" in request["messages"][1]["content"]


def test_no_hypothesis_asks_the_llm_nothing(llm_service: tuple[RagService, FakeOpenAIServer]) -> None:
    service, server = llm_service
    result = hyde(service, "what is dangerous?", {"generate_hypothetical": False})
    assert specific(result)["hypothesis_source"] == "none"
    assert _hypothesis_requests(server) == []
    assert ids(result) == ids(basic(service, "what is dangerous?"))


def test_long_hypotheses_are_embedded_in_segments(llm_service: tuple[RagService, FakeOpenAIServer]) -> None:
    service, _ = llm_service
    short = specific(hyde(service, "lava", {"hypothesis_length": 150}))
    long = specific(hyde(service, "lava", {"hypothesis_length": 500}))
    assert short["hypothesis_segments"] == 1
    assert long["hypothesis_tokens"] > SEGMENT_TOKENS
    assert long["hypothesis_segments"] >= math.ceil(long["hypothesis_tokens"] / SEGMENT_TOKENS) >= 2
    assert len(long["hypothesis"]) > len(short["hypothesis"])


def test_llm_failure_falls_back_to_prf(llm_service: tuple[RagService, FakeOpenAIServer]) -> None:
    service, server = llm_service
    server.status = 500
    result = hyde(service, "stomach bleeding")
    spec = specific(result)
    assert spec["hypothesis_source"] == "prf"
    assert spec["llm_error"]
    assert spec["prf_documents"] and result["retrieved_documents"]


# Valid text the other techniques answer (issue 11, defect 9): full-width letters, RTL marks, only
# punctuation, emoji, zero-width characters, CJK, Arabic, combining accents.
ODD_TEXT = [
    "\uff26\uff35\uff2c\uff2c\uff37\uff29\uff24\uff34\uff28 insulin",  # FULLWIDTH
    "\u202eevil\u202c rtl",
    "?!?! ... ;;",
    "🦀🧬💉 🩸",
    "\u200b\u200c\u200d\u2060",
    "胰岛素抵抗 与 糖尿病",
    "مرض السكري insulin",
    "e\u0301e\u0301 cafe\u0301 lava",
]


def test_odd_text_is_answered_while_other_calls_encode(hyde_service: RagService, embedder: Embedder) -> None:
    """The tokenizer is shared with the encoder: hyde must not use it off the encode thread meanwhile."""
    stop = threading.Event()
    encoder_errors: list[str] = []

    def encode_batches() -> None:
        # Texts of different lengths: the batch only works while the tokenizer pads it.
        while not stop.is_set():
            try:
                embedder.encode(["short", "a much longer sentence about lava and insulin " * 6, "x y"])
            except Exception as exc:
                encoder_errors.append(f"{type(exc).__name__}: {exc}")

    other_call = threading.Thread(target=encode_batches)
    other_call.start()
    failures: list[str] = []
    try:
        for _ in range(3):
            for query in ODD_TEXT:
                for params in ({}, {"hypothesis_length": 50, "prf_depth": 20}):
                    try:
                        result = hyde(hyde_service, query, params)
                    except Exception as exc:
                        failures.append(f"{query!r}: {type(exc).__name__}: {exc}")
                        continue
                    assert specific(result)["hypothesis_source"] == "prf"
                    assert result["retrieved_documents"], query
    finally:
        stop.set()
        other_call.join()
    assert not failures, failures[:3]
    assert not encoder_errors, encoder_errors[:3]


@pytest.mark.parametrize(
    ("technique", "params"),
    [
        ("hyde", {}),
        ("crag", {"confidence_threshold": 1.0, "correction_strategy": "rewrite"}),
        ("sqlrag", {"allowed_tables": ["documents_docs"], "combine_with_vector": False}),
    ],
)
def test_a_request_cancelled_during_its_llm_call_stops_at_the_next_checkpoint(
    llm_service: tuple[RagService, FakeOpenAIServer], technique: str, params: dict[str, Any]
) -> None:
    """Issue 11, defect 4: the token is cancelled while the LLM answers; no more work after that."""
    service, server = llm_service
    token = CancelToken()
    before = len(server.requests)  # the ingest's graph extraction asked the LLM too
    server.on_request = lambda _body: token.cancel("the client cancelled")
    arguments = {"query": "what is dangerous?", "collection_id": "docs", "technique_params": params}
    with cancellation_scope(token), pytest.raises(RequestCancelledError, match="the client cancelled"):
        service.execute({"technique": technique, "arguments": arguments})
    assert len(server.requests) == before + 1, "work went on after the cancellation (another LLM call)"


def test_a_cancelled_request_runs_no_technique(hyde_service: RagService) -> None:
    token = CancelToken()
    token.cancel("timed out in the front end")
    for technique in ("basic", "hyde", "crag", "sqlrag"):
        arguments = {"query": "lava", "collection_id": "docs"}
        with cancellation_scope(token), pytest.raises(RequestCancelledError):
            hyde_service.execute({"technique": technique, "arguments": arguments})

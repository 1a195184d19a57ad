"""rag_crag on a real store and model: evaluator, verdicts, the three corrections, LLM rewrite, web search.

The only test doubles are FakeOpenAIServer (a hosted OpenAI-compatible LLM cannot run here; it speaks the
real HTTP API on loopback) and LocalCorpusSearch (no web-search provider ships, by design).
"""

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import calibrate_crag
from iris_rag.backends.sqlite.store import match_expression
from iris_rag.embedder import Embedder
from iris_rag.errors import InvalidParametersError
from iris_rag.llm import first_line, strip_label
from iris_rag.schemas import tool_spec
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.stores.base import StoredChunk
from iris_rag.techniques.crag import (
    EVALUATOR_INTERCEPT,
    EVALUATOR_WEIGHTS,
    REWRITE_PROMPT,
    CragParams,
    WebResult,
    WeightedQuery,
    calibrated_confidence,
    evaluator_features,
    keyword_reformulation,
    register_search_provider,
    registered_search_providers,
    rm3_expansion,
    unregister_search_provider,
)
from tests.conftest import DOCUMENTS
from tests.fake_openai import FakeOpenAIServer

EXTRA = [
    {
        "id": "ulcer",
        "title": "Stomach ulcers",
        "content": "Stomach ulcers often bleed. Painkillers such as ibuprofen and naproxen damage the "
        "stomach lining and cause bleeding.",
        "metadata": {"year": 2022, "topic": "gastroenterology"},
    },
    {
        "id": "expedition",
        "title": "Field notes",
        "content": "The expedition packed tents and food for two weeks. Aspirin was taken daily by the "
        "older climbers to lower their heart attack risk. The weather turned cold on the third day. "
        "Snow covered the camp by the evening.",
        "metadata": {"year": 2018, "topic": "travel"},
    },
]
ALWAYS_CORRECT = {"confidence_threshold": 0.0, "incorrect_threshold": 0.0}
AMBIGUOUS = {"confidence_threshold": 1.0, "incorrect_threshold": 0.0}
INCORRECT = {"confidence_threshold": 1.0, "incorrect_threshold": 1.0}


@pytest.fixture
def crag_service(service: RagService) -> RagService:
    result = service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    assert result["ingested_count"] == 5
    return service


def crag(
    service: RagService, query: str, params: dict[str, Any] | None = None, **options: Any
) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "query": query,
        "collection_id": "docs",
        "technique_params": params or {},
        "options": {"generate": False, **options},
    }
    return service.execute({"technique": "crag", "arguments": arguments})


def ids(result: dict[str, Any]) -> list[str]:
    return [d["id"] for d in result["retrieved_documents"]]


def specific(result: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = result["metadata"]["technique_specific"]
    return spec


class LocalCorpusSearch:
    """A test web-search provider: term-overlap search over an in-memory corpus, recording every call."""

    def __init__(self, pages: list[WebResult]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, int]] = []

    def search(self, query: str, top_k: int) -> list[WebResult]:
        self.calls.append((query, top_k))
        terms = set(query.lower().split())
        scored = [(len(terms & set(page.content.lower().split())), page) for page in self.pages]
        return [page for score, page in sorted(scored, key=lambda s: -s[0]) if score > 0][:top_k]


@pytest.fixture
def web_provider() -> Iterator[LocalCorpusSearch]:
    provider = LocalCorpusSearch(
        [
            WebResult(
                "https://example.org/glaciers",
                "Glaciers",
                "glaciers carve valleys and glaciers move slowly downhill under their own weight",
            ),
            WebResult("https://example.org/tides", "Tides", "tides follow the moon"),
        ]
    )
    register_search_provider("local_test_provider", provider)
    yield provider
    unregister_search_provider("local_test_provider")


def test_evaluator_reports_calibrated_confidence(crag_service: RagService) -> None:
    result = crag(crag_service, "Does aspirin reduce heart attacks?", ALWAYS_CORRECT)
    spec = specific(result)
    features = spec["evaluator"]["features"]
    assert set(features) == set(EVALUATOR_WEIGHTS)
    assert spec["initial_confidence"] == pytest.approx(calibrated_confidence(features), abs=1e-5)
    assert 0 <= spec["initial_confidence"] <= 1
    assert spec["verdict"] == "correct" and spec["action"] == "none"
    assert spec["final_confidence"] == spec["initial_confidence"]
    # A correct first pass is plain dense retrieval: the same ranking and cosines as rag_basic.
    basic = crag_service.execute(
        {
            "technique": "basic",
            "arguments": {
                "query": "Does aspirin reduce heart attacks?",
                "collection_id": "docs",
                "options": {"generate": False},
            },
        }
    )
    assert ids(result) == ids(basic)
    assert [d["similarity_score"] for d in result["retrieved_documents"]] == [
        d["similarity_score"] for d in basic["retrieved_documents"]
    ]


def test_evaluator_features_and_logistic_model() -> None:
    def chunk(doc: str, text: str) -> StoredChunk:
        return StoredChunk(f"{doc}#0", doc, 0, text, 0, len(text))

    ranked = [(chunk(f"d{i}", "aspirin bleeding" if i == 0 else "bread"), 0.9 - 0.1 * i) for i in range(6)]
    idf = {"aspirin": 2.0, "heart": 1.0}
    features = evaluator_features({"aspirin", "heart"}, ranked, ["d0", "d5", "x"], idf)
    assert features["margin"] == pytest.approx(0.9 - 0.5)  # best minus 5th
    assert features["query_overlap"] == pytest.approx(2.0 / 3.0)  # 'aspirin' (idf 2) of 3 found
    assert features["keyword_agreement"] == pytest.approx(2 / 6)
    assert features["top1_in_keyword"] == 1.0
    # The calibrated model: more margin and agreement mean more confidence.
    low = calibrated_confidence(dict.fromkeys(EVALUATOR_WEIGHTS, 0.0))
    assert low == pytest.approx(1 / (1 + 2.718281828 ** (-EVALUATOR_INTERCEPT)), rel=1e-6)
    assert calibrated_confidence(features) > low
    assert all(weight > 0 for weight in EVALUATOR_WEIGHTS.values())


def test_schema_and_parameter_model_agree() -> None:
    """The tool's JSON Schema (what MCP clients see and the worker validates) matches CragParams."""
    spec = tool_spec("rag_crag")
    assert spec is not None
    schema = spec["inputSchema"]["properties"]["technique_params"]
    assert schema["additionalProperties"] is False
    model = CragParams.model_json_schema()["properties"]
    assert set(schema["properties"]) == set(model) == set(CragParams.model_fields)
    for name, declared in schema["properties"].items():
        expected = next((b for b in model[name].get("anyOf", []) if b.get("type") != "null"), model[name])
        for key in ("type", "minimum", "maximum", "enum", "pattern"):
            assert declared.get(key) == expected.get(key), (name, key)
        assert declared.get("default") == model[name].get("default"), name
    # The ranges and defaults.
    properties = schema["properties"]
    assert properties["confidence_threshold"] | {"description": ""} == {
        "type": "number",
        "minimum": 0,
        "maximum": 1,
        "default": 0.8,
        "description": "",
    }
    assert properties["correction_strategy"]["enum"] == ["rewrite", "expand", "filter"]
    assert properties["correction_strategy"]["default"] == "rewrite"
    assert properties["enable_web_search"]["default"] is False


@pytest.mark.parametrize(
    "params",
    [
        {"confidence_threshold": 1.01},
        {"confidence_threshold": -0.1},
        {"correction_strategy": "rerank"},
        {"enable_web_search": "yes"},
        {"strip_threshold": 2},
        {"web_search_provider": "bad name"},
        {"unknown": 1},
    ],
)
def test_out_of_range_parameters_are_invalid(service: RagService, params: dict[str, Any]) -> None:
    # Rejected before any collection is looked up (the schema, then the parameter model).
    with pytest.raises(InvalidParametersError):
        crag(service, "aspirin", params)


def test_defaults_correct_below_0_8(crag_service: RagService) -> None:
    # Confidences on this corpus: about 0.88 for the first query, 0.70 for the second (vague) one.
    confident = crag(crag_service, "things that move slowly")
    doubtful = crag(crag_service, "what is dangerous?")
    for result in (confident, doubtful):
        spec = specific(result)
        assert spec["confidence_threshold"] == 0.8 and spec["incorrect_threshold"] == 0.4
        assert spec["correction_strategy"] == "rewrite"
        assert spec["web_search"] == {"enabled": False, "called": False}
    assert specific(confident)["initial_confidence"] >= 0.8
    assert specific(confident)["verdict"] == "correct" and specific(confident)["action"] == "none"
    assert 0.4 <= specific(doubtful)["initial_confidence"] < 0.8
    assert specific(doubtful)["verdict"] == "ambiguous" and specific(doubtful)["action"] == "rewrite"
    assert specific(doubtful)["rewritten_query"] == "dangerous"
    lowered = crag(crag_service, "what is dangerous?", {"confidence_threshold": 0.6})
    assert specific(lowered)["verdict"] == "correct" and specific(lowered)["action"] == "none"


def test_calibration_refuses_the_test_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["calibrate_crag", "--dataset", "unused", "--split", "test"])
    with pytest.raises(SystemExit) as exit_info:
        calibrate_crag.main()
    assert exit_info.value.code == 2


def test_calibration_fit_recovers_a_known_logistic_model() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5000, 2))
    true = np.array([-0.5, 2.0, -1.0])
    y = (rng.random(5000) < 1 / (1 + np.exp(-(true[0] + x @ true[1:])))).astype(np.float64)
    weights = calibrate_crag.fit_logistic(x, y)
    assert np.allclose(weights, true, atol=0.15)
    assert calibrate_crag.auc(calibrate_crag.predict(weights, x), y) > 0.75
    assert calibrate_crag.auc(-x[:, 0], y) < 0.5


def test_confidence_threshold_decides_whether_to_correct(crag_service: RagService) -> None:
    query = "bread dough lava"
    kept = crag(crag_service, query, ALWAYS_CORRECT, top_k=5)
    corrected = crag(crag_service, query, AMBIGUOUS, top_k=5)
    assert specific(kept)["verdict"] == "correct" and specific(kept)["action"] == "none"
    assert specific(corrected)["verdict"] == "ambiguous" and specific(corrected)["action"] == "rewrite"
    confidence = specific(kept)["initial_confidence"]
    # A threshold just above the confidence corrects, one at it keeps.
    at = crag(crag_service, query, {"confidence_threshold": confidence - 1e-7, "incorrect_threshold": 0})
    above = crag(crag_service, query, {"confidence_threshold": min(1.0, confidence + 1e-6)})
    assert specific(at)["verdict"] == "correct"
    assert specific(above)["verdict"] != "correct"
    # The correction adds the keyword leg: 'lava' only matches the volcano text.
    top = corrected["retrieved_documents"]
    volcano = next(d for d in top if d["id"] == "volcano")
    assert volcano["score_details"]["corrected_keyword_rank"] is not None
    assert "score_details" not in kept["retrieved_documents"][0]


def test_incorrect_threshold_drops_the_first_pass(crag_service: RagService) -> None:
    # Dense search puts the aspirin text first; the keyword leg prefers the expedition ("lower ... risk").
    query = "what lowers the risk"
    ambiguous = crag(crag_service, query, AMBIGUOUS, top_k=5)
    incorrect = crag(crag_service, query, INCORRECT, top_k=5)
    assert specific(ambiguous)["verdict"] == "ambiguous"
    assert specific(incorrect)["verdict"] == "incorrect"
    # Without an LLM the corrected dense leg is the query's own: weights add up on one dense leg.
    assert specific(ambiguous)["leg_weights"] == {"dense": 0.75, "corrected_keyword": 0.25}
    assert specific(incorrect)["leg_weights"] == {"dense": 0.5, "corrected_keyword": 0.5}
    for result, (dense_weight, keyword_weight) in ((ambiguous, (0.75, 0.25)), (incorrect, (0.5, 0.5))):
        for document in result["retrieved_documents"]:
            details = document["score_details"]
            assert details["fused_score"] == pytest.approx(
                dense_weight * details["dense_norm"] + keyword_weight * details["corrected_keyword_norm"],
                abs=1e-5,
            )
    assert ids(ambiguous)[0] == "aspirin"
    assert ids(incorrect)[0] == "expedition", "with the first pass judged wrong, the keyword evidence leads"


@pytest.mark.parametrize("threshold", [0.0, 0.1, 0.3, 0.39])
def test_every_confidence_threshold_works_with_the_default_incorrect_threshold(
    crag_service: RagService, threshold: float
) -> None:
    """The schema promises 0..1; below the default incorrect_threshold (0.4) it is capped, never refused."""
    result = crag(crag_service, "bread dough lava", {"confidence_threshold": threshold}, top_k=5)
    spec = specific(result)
    assert spec["confidence_threshold"] == threshold and spec["incorrect_threshold"] == threshold
    expected = "correct" if spec["initial_confidence"] >= threshold else "incorrect"
    assert spec["verdict"] == expected
    never = crag(crag_service, "bread dough lava", {"confidence_threshold": 0.0, "incorrect_threshold": 0.9})
    assert specific(never)["verdict"] == "correct", "0 never corrects"


@pytest.mark.parametrize("strategy", ["rewrite", "expand", "filter"])
def test_corrections_report_their_final_confidence(crag_service: RagService, strategy: str) -> None:
    query = "what lowers the risk"
    result = crag(crag_service, query, {**INCORRECT, "correction_strategy": strategy}, top_k=5)
    spec = specific(result)
    assert spec["action"] == strategy
    final = spec["final_confidence"]
    assert 0 <= final <= 1
    assert final == pytest.approx(calibrated_confidence(spec["final_evaluator_features"]), abs=1e-5)
    if strategy != "expand":  # expand keeps the first pass's order on this query
        # rewrite puts the expedition first, filter drops chunks: the evaluator is re-run over the
        # corrected ranking, not copied from the first pass.
        assert ids(result) != ids(crag(crag_service, query, ALWAYS_CORRECT, top_k=5))
        assert spec["final_evaluator_features"] != spec["evaluator"]["features"]
        assert final != spec["initial_confidence"]


def test_rewrite_without_llm_is_a_keyword_reformulation(crag_service: RagService) -> None:
    result = crag(crag_service, "What does aspirin do to the stomach?", INCORRECT)
    spec = specific(result)
    assert spec["rewrite_source"] == "keywords"
    assert "llm_error" not in spec
    # Stopwords dropped; terms ordered by specificity; the rarest weigh double.
    assert set(spec["rewritten_query"].split()) == {"aspirin", "stomach"}
    assert spec["keyword_query"] == {"aspirin": 2, "stomach": 2}
    assert {"aspirin", "ulcer"} <= set(ids(result))


def test_keyword_reformulation_drops_generic_terms() -> None:
    frequency = {"cell": 50, "user": 30, "aspirin": 2, "bleed": 10}
    weighted = keyword_reformulation("Do cells of aspirin users bleed?", frequency, 100)
    assert set(weighted.weights) == {"aspirin", "bleed"}  # cells and users are in > 20% of chunks
    assert weighted.weights["aspirin"] == 2 and weighted.weights["bleed"] == 1
    assert weighted.text == "aspirin bleed"
    assert match_expression(WeightedQuery({"a": 2, "b": 1}).keyword_query()) == '"a" OR "a" OR "b"'
    only_generic = keyword_reformulation("cells", frequency, 100)
    assert only_generic.weights == {"cells": 2}, "nothing specific left: keep what there is"


def test_expand_adds_feedback_terms(crag_service: RagService) -> None:
    rewrite = crag(crag_service, "aspirin", INCORRECT, top_k=5)
    expand = crag(crag_service, "aspirin", {**INCORRECT, "correction_strategy": "expand"}, top_k=5)
    spec = specific(expand)
    assert spec["action"] == "expand"
    assert spec["feedback_documents"][0] in {"aspirin", "expedition"}
    assert spec["expansion_terms"] and "aspirin" not in spec["expansion_terms"]
    assert next(iter(spec["expanded_query"])) == "aspirin", "the original term keeps the largest weight"
    assert sum(spec["expanded_query"].values()) == pytest.approx(1.0, abs=1e-4)

    # 'ulcer' never says aspirin: only the expansion terms (bleeding, stomach, ...) find it by keyword.
    def keyword_rank(result: dict[str, Any], doc: str) -> Any:
        return next(
            d["score_details"]["corrected_keyword_rank"]
            for d in result["retrieved_documents"]
            if d["id"] == doc
        )

    assert keyword_rank(rewrite, "ulcer") is None
    assert keyword_rank(expand, "ulcer") is not None


def test_rm3_weights() -> None:
    feedback = [
        (StoredChunk("a#0", "a", 0, "bleeding bleeding stomach", 0, 10), 3.0),
        (StoredChunk("b#0", "b", 0, "bleeding lava", 0, 10), 1.0),
    ]
    weighted, exact = rm3_expansion("aspirin", feedback, {}, 100)
    # P(t|R): bleeding = .75*2/3 + .25*1/2 = .625, stomach = .75/3 = .25, lava = .25/2 = .125
    assert exact["aspirin"] == pytest.approx(0.7)
    assert exact["bleeding"] == pytest.approx(0.3 * 0.625)
    assert exact["stomach"] == pytest.approx(0.3 * 0.25)
    assert exact["lava"] == pytest.approx(0.3 * 0.125)
    assert weighted.weights["aspirin"] == 5 and weighted.weights["lava"] == 1


def test_filter_keeps_relevant_strips(crag_service: RagService) -> None:
    query = "aspirin lowers heart attack risk"
    result = crag(crag_service, query, {**AMBIGUOUS, "correction_strategy": "filter"}, top_k=5)
    spec = specific(result)
    assert spec["action"] == "filter"
    assert spec["strips_kept"] < spec["strips_total"]
    notes = next(d for d in result["retrieved_documents"] if d["id"] == "expedition")
    assert notes["content"] == (
        "Aspirin was taken daily by the older climbers to lower their heart attack risk."
    )
    assert notes["score_details"]["strips_kept"] == 1 and notes["score_details"]["strips_total"] == 4
    loose = crag(crag_service, query, {**AMBIGUOUS, "correction_strategy": "filter", "strip_threshold": 0})
    assert specific(loose)["strips_kept"] > spec["strips_kept"]
    strict = crag(crag_service, query, {**AMBIGUOUS, "correction_strategy": "filter", "strip_threshold": 0.5})
    assert specific(strict)["chunks_dropped"] > 0
    assert len(strict["retrieved_documents"]) < len(loose["retrieved_documents"])
    # Incorrect ranks by the best kept strip alone: the expedition's one aspirin sentence can lead.
    incorrect = crag(crag_service, query, {**INCORRECT, "correction_strategy": "filter"}, top_k=5)
    assert specific(incorrect)["leg_weights"] == {"strips": 1.0}
    strips = [d["score_details"]["strips_norm"] for d in incorrect["retrieved_documents"]]
    assert strips == sorted(strips, reverse=True)


def test_filter_answer_quotes_only_kept_strips(crag_service: RagService) -> None:
    result = crag(
        crag_service,
        "aspirin lowers heart attack risk",
        {**INCORRECT, "correction_strategy": "filter"},
        generate=True,
        top_k=5,
    )
    assert result["answer"] is not None
    assert "Snow covered the camp" not in result["answer"]


@pytest.mark.parametrize("strategy", ["rewrite", "expand", "filter"])
def test_filters_apply_in_every_strategy(crag_service: RagService, strategy: str) -> None:
    query = "aspirin bleeding stomach bread lava"
    for params in (ALWAYS_CORRECT, AMBIGUOUS, INCORRECT):
        result = crag(
            crag_service,
            query,
            {**params, "correction_strategy": strategy, "strip_threshold": 0},
            top_k=5,
            filters={"year": {"gte": 2020}},
        )
        assert set(ids(result)) <= {"ulcer", "volcano", "sourdough"}
        assert result["retrieved_documents"]
        assert result["metadata"]["filters"]["matched_documents"] == 3
    nothing = crag(
        crag_service, query, {**INCORRECT, "correction_strategy": strategy}, filters={"colour": "red"}
    )
    assert nothing["retrieved_documents"] == []


def test_generate_false_and_true(crag_service: RagService) -> None:
    evidence = crag(crag_service, "aspirin bleeding", AMBIGUOUS)
    assert evidence["answer"] is None and evidence["retrieved_documents"]
    answered = crag(crag_service, "aspirin bleeding", AMBIGUOUS, generate=True)
    assert answered["answer"] and "[1]" in answered["answer"]


# --- LLM path ---------------------------------------------------------------------------------------------
def _llm_service(tmp_path: Path, embedder: Embedder, server: FakeOpenAIServer) -> RagService:
    settings = Settings(
        RAG_DATA_DIR=tmp_path / "llm",
        **server.llm_settings(),
    )
    service = RagService(settings, embedder=embedder)
    service.ingest({"collection_id": "docs", "documents": DOCUMENTS + EXTRA})
    return service


def test_llm_rewrite(tmp_path: Path, embedder: Embedder) -> None:
    # FakeOpenAIServer is the test double for the configured OpenAI-compatible LLM.
    server = FakeOpenAIServer(reply="Rewritten query: sourdough bread fermentation with wild yeast\n")
    service = _llm_service(tmp_path, embedder, server)
    query = "what is dangerous?"
    try:
        kept = crag(service, query, ALWAYS_CORRECT, top_k=3)
        incorrect = crag(service, query, INCORRECT, top_k=3)
        ambiguous = crag(service, query, AMBIGUOUS, top_k=5)
    finally:
        service.close()
        server.close()
    # (Ingest asked the same server for graph extraction; the rewrite is the request with our prompt.)
    rewrites = [r["body"] for r in server.requests if r["body"]["messages"][0]["content"] == REWRITE_PROMPT]
    assert len(rewrites) == 2, "a correct verdict asks nothing; each correction asks once"
    assert rewrites[0]["model"] == "fake-model"
    assert rewrites[0]["messages"][1]["content"] == "Query: what is dangerous?"
    assert rewrites[0]["temperature"] == 0.0 and rewrites[0]["max_tokens"] == 96

    assert ids(kept)[0] == "aspirin", "dense search alone does not find the bread"
    spec = specific(incorrect)
    assert spec["rewrite_source"] == "llm"
    assert spec["rewritten_query"] == "sourdough bread fermentation with wild yeast"
    assert spec["leg_weights"] == {"corrected_dense": 0.5, "corrected_keyword": 0.5}
    assert ids(incorrect)[0] == "sourdough", "the rewrite's own dense and keyword legs lead"

    # Ambiguous: the first pass keeps half the weight, next to the rewrite's own dense and keyword legs.
    weights = specific(ambiguous)["leg_weights"]
    assert weights == {"first_pass": 0.5, "corrected_dense": 0.25, "corrected_keyword": 0.25}
    for document in ambiguous["retrieved_documents"]:
        details = document["score_details"]
        assert details["fused_score"] == pytest.approx(
            sum(weight * details[f"{leg}_norm"] for leg, weight in weights.items()), abs=1e-5
        )
    first_pass_top = next(d for d in ambiguous["retrieved_documents"] if d["id"] == "aspirin")
    assert first_pass_top["score_details"]["first_pass_rank"] == 1


def test_llm_reply_cleaning() -> None:
    assert first_line('\n  Rewritten query: "aspirin and stomach bleeding"\nBecause...') == (
        "aspirin and stomach bleeding"
    )
    assert first_line("Why: the claim is vague") == "Why: the claim is vague", "only known labels go"
    assert strip_label("Passage: Aspirin thins blood.") == "Aspirin thins blood."
    assert first_line("   \n") == ""


def test_llm_failure_falls_back_to_keywords(tmp_path: Path, embedder: Embedder) -> None:
    server = FakeOpenAIServer(status=500)
    service = _llm_service(tmp_path, embedder, server)
    try:
        result = crag(service, "aspirin stomach", INCORRECT)
    finally:
        service.close()
        server.close()
    spec = specific(result)
    assert spec["rewrite_source"] == "keywords"
    assert "500" in spec["llm_error"] or "InternalServerError" in spec["llm_error"]
    assert result["retrieved_documents"]


# --- Web search -------------------------------------------------------------------------------------------
def test_web_search_without_provider_is_invalid(crag_service: RagService) -> None:
    assert "local_test_provider" not in registered_search_providers()
    with pytest.raises(InvalidParametersError, match="no web-search provider is registered") as error:
        crag(crag_service, "glaciers", {"enable_web_search": True, **ALWAYS_CORRECT})
    assert error.value.code == "INVALID_PARAMETERS"


def test_web_search_is_off_by_default(crag_service: RagService, web_provider: LocalCorpusSearch) -> None:
    result = crag(crag_service, "glaciers valleys", INCORRECT, top_k=3)
    assert web_provider.calls == []
    assert specific(result)["web_search"] == {"enabled": False, "called": False}
    assert all(d["metadata"].get("origin") != "web" for d in result["retrieved_documents"])


def test_registered_provider_is_called_when_confidence_is_low(
    crag_service: RagService, web_provider: LocalCorpusSearch
) -> None:
    confident = crag(crag_service, "glaciers valleys", {"enable_web_search": True, **ALWAYS_CORRECT})
    assert web_provider.calls == []
    assert specific(confident)["web_search"] == {"enabled": True, "called": False}

    result = crag(crag_service, "glaciers valleys", {"enable_web_search": True, **INCORRECT}, top_k=3)
    assert web_provider.calls == [("glaciers valleys", 3)]
    web = specific(result)["web_search"]
    assert web["called"] and web["provider"] == "local_test_provider" and web["results"] == 1
    top = result["retrieved_documents"][0]
    assert top["id"] == "https://example.org/glaciers"
    assert top["metadata"]["origin"] == "web" and top["source"] == "https://example.org/glaciers"

    filtered = crag(
        crag_service, "glaciers valleys", {"enable_web_search": True, **INCORRECT}, filters={"year": 2021}
    )
    assert "skipped" in specific(filtered)["web_search"] and len(web_provider.calls) == 1
    assert ids(filtered) == ["volcano"]


def test_provider_choice(crag_service: RagService, web_provider: LocalCorpusSearch) -> None:
    other = LocalCorpusSearch([WebResult("https://example.org/tides", "Tides", "glaciers and tides")])
    register_search_provider("second_provider", other)
    try:
        with pytest.raises(InvalidParametersError, match="name one"):
            crag(crag_service, "glaciers", {"enable_web_search": True, **INCORRECT})
        crag(
            crag_service,
            "glaciers",
            {"enable_web_search": True, "web_search_provider": "second_provider", **INCORRECT},
        )
        assert other.calls and not web_provider.calls
        with pytest.raises(InvalidParametersError, match="no web-search provider named"):
            crag(crag_service, "glaciers", {"enable_web_search": True, "web_search_provider": "nope"})
    finally:
        unregister_search_provider("second_provider")


def test_web_results_are_refined_by_the_filter_strategy(
    crag_service: RagService, web_provider: LocalCorpusSearch
) -> None:
    result = crag(
        crag_service,
        "glaciers valleys",
        {"enable_web_search": True, "correction_strategy": "filter", "strip_threshold": 0, **INCORRECT},
    )
    web = [d for d in result["retrieved_documents"] if d["metadata"].get("origin") == "web"]
    assert web and web[0]["score_details"]["strips_total"] == 1


@pytest.mark.parametrize("strategy", ["rewrite", "expand", "filter"])
def test_odd_text_is_corrected_without_failing(crag_service: RagService, strategy: str) -> None:
    """Issue 11, defect 9: valid but odd text goes through every correction (no LLM: keyword rewrite)."""
    from tests.techniques.test_hyde import ODD_TEXT

    for query in ODD_TEXT:
        result = crag(crag_service, query, {"confidence_threshold": 1.0, "correction_strategy": strategy})
        assert specific(result)["action"] == strategy, query

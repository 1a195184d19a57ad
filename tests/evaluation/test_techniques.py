"""Technique names: registered pipelines, eval-only variants, 'all', parameters from the command line."""

import pytest

from iris_rag.errors import InvalidParametersError, PipelineNotFoundError
from iris_rag.evaluation.techniques import VARIANTS, TechniqueSpec, available, parse_params, resolve
from iris_rag.techniques.hybrid_ifind import HybridParams


def test_unknown_technique_lists_the_valid_names() -> None:
    with pytest.raises(PipelineNotFoundError, match=r"unknown technique 'nope'; valid: basic, all") as caught:
        resolve("basic,nope", ["basic"])
    assert caught.value.details == {"available": ["basic"]}


def test_variants_need_their_base_technique() -> None:
    assert VARIANTS["keyword"][0] == "hybrid_ifind"
    assert available(["basic"]) == ["basic"]
    with pytest.raises(PipelineNotFoundError):
        resolve("keyword", ["basic"])


def test_all_is_every_registered_technique_and_its_variants() -> None:
    specs = resolve("all", ["basic", "hybrid_ifind"])
    assert [s.name for s in specs] == ["basic", "hybrid_ifind", "keyword", "keyword_multifield"]
    assert specs[2] == TechniqueSpec("keyword", "hybrid_ifind", VARIANTS["keyword"][1])


def test_keyword_multifield_variant_is_the_keyword_leg_with_multifield_bm25() -> None:
    (spec,) = resolve("keyword_multifield", ["basic", "hybrid_ifind"])
    assert spec.base == "hybrid_ifind"
    assert spec.params == {
        "vector_weight": 0.0,
        "keyword_weight": 1.0,
        "fusion_method": "weighted",
        "keyword_scoring": "multifield",
    }
    # The parameters are valid technique_params of rag_hybrid_ifind.
    assert HybridParams.model_validate(spec.params).keyword_scoring == "multifield"


def test_command_line_params_update_a_technique() -> None:
    overrides = parse_params(['keyword={"keyword_weight": 0.5}', 'hybrid_ifind={"vector_weight": 0.6}'])
    specs = resolve("hybrid_ifind,keyword,hybrid_ifind", ["basic", "hybrid_ifind"], overrides)
    assert [s.name for s in specs] == ["hybrid_ifind", "keyword"]
    assert specs[0].params == {"vector_weight": 0.6}
    assert specs[1].params == {**VARIANTS["keyword"][1], "keyword_weight": 0.5}
    with pytest.raises(InvalidParametersError, match="'other'"):
        resolve("basic", ["basic"], {"other": {}})


def test_params_for_a_technique_not_evaluated_say_so() -> None:
    """`eval` serves only the techniques it scores, so hybrid_ifind is not registered here: not 'unknown'."""
    with pytest.raises(InvalidParametersError) as caught:
        resolve("basic", ["basic"], {"hybrid_ifind": {"vector_weight": 0.6}})
    assert caught.value.message == (
        "--params names 'hybrid_ifind', which --techniques does not (basic); add it to --techniques"
    )
    with pytest.raises(InvalidParametersError, match="--params names 'nope', which --techniques does not"):
        resolve("all", ["basic", "hybrid_ifind"], {"nope": {}})


@pytest.mark.parametrize("item", ["basic", "basic={not json", "basic=[1]", '={"a": 1}'])
def test_malformed_params_are_refused(item: str) -> None:
    with pytest.raises(InvalidParametersError, match="--params"):
        parse_params([item])

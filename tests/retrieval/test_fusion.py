"""Fusion math on hand-computed examples."""

import pytest

from iris_rag.retrieval.fusion import min_max, reciprocal_rank_fusion, weighted_fusion


def test_min_max() -> None:
    assert min_max({"a": 2.0, "b": 4.0, "c": 3.0}) == {"a": 0.0, "b": 1.0, "c": 0.5}
    assert min_max({"a": 0.3, "b": 0.3}) == {"a": 1.0, "b": 1.0}
    assert min_max({}) == {}


def test_weighted_fusion_by_hand() -> None:
    dense = {"a": 0.9, "b": 0.5, "c": 0.7}  # c was found by the keyword leg only; its cosine is exact
    keyword = {"b": 10.0, "c": 5.0}
    fused = weighted_fusion(dense, keyword, ["a", "b"], ["b", "c"], vector_weight=0.6, keyword_weight=0.4)
    by_id = {f.chunk_id: f for f in fused}
    # dense_norm: a 1.0, b 0.0, c 0.5; keyword_norm: b 1.0, c 0.5, a 0.
    assert by_id["a"].fused_score == pytest.approx(0.6)
    assert by_id["b"].fused_score == pytest.approx(0.4)
    assert by_id["c"].fused_score == pytest.approx(0.6 * 0.5 + 0.4 * 0.5)
    assert [f.chunk_id for f in fused] == ["a", "c", "b"]
    assert (by_id["c"].dense_rank, by_id["c"].keyword_rank) == (None, 2)
    assert by_id["a"].keyword_score is None and by_id["a"].keyword_norm == 0.0
    only_keywords = weighted_fusion(dense, keyword, ["a", "b"], ["b", "c"], vector_weight=0, keyword_weight=1)
    assert [f.chunk_id for f in only_keywords][:2] == ["b", "c"]


def test_rrf_by_hand() -> None:
    dense = {"a": 0.9, "b": 0.5, "c": 0.1}
    keyword = {"c": 3.0, "b": 2.0}
    fused = reciprocal_rank_fusion(
        dense, keyword, ["a", "b", "c"], ["c", "b"], vector_weight=1, keyword_weight=1, k=60
    )
    by_id = {f.chunk_id: f.fused_score for f in fused}
    assert by_id["a"] == pytest.approx(1 / 61)
    assert by_id["b"] == pytest.approx(1 / 62 + 1 / 62)
    assert by_id["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert [f.chunk_id for f in fused] == ["c", "b", "a"]
    small_k = reciprocal_rank_fusion(
        dense, keyword, ["a", "b", "c"], ["c", "b"], vector_weight=1, keyword_weight=0, k=1
    )
    assert [f.chunk_id for f in small_k] == ["a", "b", "c"]


def test_weighted_sum_scales_each_leg_over_the_candidates() -> None:
    """The one rule behind hybrid's and CRAG's fusion: BM25 over the best, cosines min-max."""
    from iris_rag.retrieval.fusion import WeightedLeg, scaled, weighted_sum

    assert scaled({"a": 2.0, "b": 4.0}, natural_zero=True) == {"a": 0.5, "b": 1.0}
    assert scaled({"a": 2.0, "b": 4.0}, natural_zero=False) == {"a": 0.0, "b": 1.0}
    legs = [
        WeightedLeg(0.5, {"a": 0.9, "b": 0.7, "outside": 0.1}, natural_zero=False),
        WeightedLeg(0.5, {"b": 6.0, "c": 3.0}, natural_zero=True),
    ]
    totals, (cosine, bm25) = weighted_sum(legs, ["a", "b", "c"])
    assert cosine == {"a": 1.0, "b": 0.0}, "scaled over the candidates only: 'outside' does not count"
    assert bm25 == {"b": 1.0, "c": 0.5}
    assert totals == {"a": 0.5, "b": 0.5, "c": 0.25}

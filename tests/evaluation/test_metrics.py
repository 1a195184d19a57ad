"""The measures against rankings scored by hand on a tiny BEIR folder."""

import math
from pathlib import Path

import pytest

from iris_rag.errors import InvalidParametersError
from iris_rag.evaluation.beir import BeirDataset, load_beir
from iris_rag.evaluation.metrics import score_queries, score_run
from tests.evaluation.conftest import write_beir

CORPUS = [{"_id": f"d{i}", "title": f"Doc {i}", "text": f"text {i}"} for i in range(1, 5)]


@pytest.fixture
def dataset(tmp_path: Path) -> BeirDataset:
    # q3's only judgment is 0 (not relevant): BEIR drops it, so it must not count in any mean.
    return load_beir(
        write_beir(
            tmp_path / "tiny",
            CORPUS,
            {"q1": "first", "q2": "second", "q3": "third"},
            [("q1", "d1", 1), ("q2", "d2", 1), ("q2", "d3", 1), ("q3", "d4", 0)],
        )
    )


def test_loading_drops_queries_without_a_relevant_document(dataset: BeirDataset) -> None:
    assert dataset.name == "tiny"
    assert list(dataset.queries) == ["q1", "q2"]
    assert dataset.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 1}}
    assert [d.id for d in dataset.corpus] == ["d1", "d2", "d3", "d4"]
    assert (dataset.corpus[0].title, dataset.corpus[0].content) == ("Doc 1", "text 1")


def test_measures_match_the_formulas(dataset: BeirDataset) -> None:
    rankings = {"q1": ["d4", "d1", "d2", "d3"], "q2": ["d2", "d1", "d4", "d3"]}
    per_query = score_queries(dataset.qrels, rankings)

    # q1: its one relevant document at rank 2 → DCG = 1/log2(2+1), ideal DCG = 1/log2(1+1) = 1.
    assert per_query["q1"]["ndcg@10"] == pytest.approx(1 / math.log2(3))
    assert per_query["q1"]["mrr@10"] == pytest.approx(1 / 2)
    assert per_query["q1"]["recall@10"] == 1.0
    # q2: relevant at ranks 1 and 4 → DCG = 1 + 1/log2(5); ideal (ranks 1, 2) = 1 + 1/log2(3).
    ndcg_q2 = (1 + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert per_query["q2"]["ndcg@10"] == pytest.approx(ndcg_q2)
    assert per_query["q2"]["mrr@10"] == 1.0

    means = score_run(dataset.qrels, rankings)
    assert means["ndcg@10"] == pytest.approx((1 / math.log2(3) + ndcg_q2) / 2)
    assert means["mrr@10"] == pytest.approx((1 / 2 + 1) / 2)
    assert means["recall@10"] == means["recall@100"] == 1.0


def test_cutoffs_at_10_and_100(dataset: BeirDataset) -> None:
    filler = [f"x{i}" for i in range(10)]
    # q1's relevant document at rank 11: outside every @10 measure, inside @100.
    # q2: one of its two relevant documents at rank 1 → recall@10 = 1/2; the other at rank 150 (beyond 100).
    rankings = {"q1": [*filler, "d1"], "q2": ["d2", *[f"y{i}" for i in range(148)], "d3"]}
    per_query = score_queries(dataset.qrels, rankings)
    # trec_eval's recip_rank alone would say 1/11 here; MRR@10 is 0.
    assert per_query["q1"] == {"ndcg@10": 0.0, "recall@10": 0.0, "recall@100": 1.0, "mrr@10": 0.0}
    assert per_query["q2"]["recall@10"] == per_query["q2"]["recall@100"] == 0.5
    assert per_query["q2"]["ndcg@10"] == pytest.approx(1 / (1 + 1 / math.log2(3)))


def test_a_query_with_no_results_counts_as_zero(dataset: BeirDataset) -> None:
    means = score_run(dataset.qrels, {"q1": ["d1"], "q2": []})
    assert means == {"ndcg@10": 0.5, "recall@10": 0.5, "recall@100": 0.5, "mrr@10": 0.5}


def test_the_given_order_is_scored_not_document_ids(dataset: BeirDataset) -> None:
    # Equal raw scores would make trec_eval order by document id; the run's scores come from rank instead.
    assert score_queries(dataset.qrels, {"q1": ["d4", "d1"]})["q1"]["mrr@10"] == 0.5
    assert score_queries(dataset.qrels, {"q1": ["d1", "d4"]})["q1"]["mrr@10"] == 1.0


def test_train_split_uses_its_own_queries_file(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "ds", CORPUS, {"q1": "test query"}, [("q1", "d1", 1)])
    write_beir(root, CORPUS, {"q1": "test query"}, [("t1", "d2", 2)], split="train")
    (root / "queries_train.jsonl").write_text('{"_id": "t1", "text": "train query"}\n', encoding="utf-8")
    train = load_beir(root, "train")
    assert (train.split, train.queries, train.qrels) == ("train", {"t1": "train query"}, {"t1": {"d2": 2}})
    assert load_beir(root).queries == {"q1": "test query"}


def test_limited_keeps_the_first_queries(dataset: BeirDataset) -> None:
    one = dataset.limited(1)
    assert (one.queries, one.qrels) == ({"q1": "first"}, {"q1": {"d1": 1}})


@pytest.mark.parametrize(
    "qrels",
    [
        [],  # the header only
        [("q1", "d1", 0), ("q2", "d2", 0)],  # judged, but none relevant: BEIR drops them all
    ],
)
def test_a_split_with_no_judged_query_is_refused_not_scored_zero(
    tmp_path: Path, qrels: list[tuple[str, str, int]]
) -> None:
    root = write_beir(tmp_path / "ds", CORPUS, {"q1": "first", "q2": "second"}, qrels)
    with pytest.raises(InvalidParametersError, match=r"no judged queries in '.*test\.tsv' for split 'test'"):
        load_beir(root)

"""The measures against rankings scored by hand on a tiny BEIR folder, and the folder's reading."""

import codecs
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
    # q3 is in no qrels row: BEIR leaves it out, so it must not count in any mean.
    return load_beir(
        write_beir(
            tmp_path / "tiny",
            CORPUS,
            {"q1": "first", "q2": "second", "q3": "third"},
            [("q1", "d1", 1), ("q2", "d2", 1), ("q2", "d3", 1)],
        )
    )


def test_loading_drops_queries_without_a_judgment(dataset: BeirDataset) -> None:
    assert dataset.name == "tiny"
    assert list(dataset.queries) == ["q1", "q2"]
    assert dataset.unjudged_queries == 1
    assert dataset.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1, "d3": 1}}
    assert [d.id for d in dataset.corpus] == ["d1", "d2", "d3", "d4"]
    assert (dataset.corpus[0].title, dataset.corpus[0].content) == ("Doc 1", "text 1")


def test_a_query_judged_only_not_relevant_is_kept_and_scores_zero(tmp_path: Path) -> None:
    """BEIR keeps every query in qrels ({qid: queries[qid] for qid in qrels}); pytrec_eval scores it 0."""
    root = write_beir(
        tmp_path / "ds",
        CORPUS,
        {"q1": "first", "q2": "second", "q3": "third"},
        [("q1", "d1", 1), ("q2", "d3", 0), ("q3", "d4", -1)],
    )
    loaded = load_beir(root)
    assert list(loaded.queries) == ["q1", "q2", "q3"]
    assert loaded.qrels == {"q1": {"d1": 1}, "q2": {"d3": 0}, "q3": {"d4": -1}}
    rankings = {"q1": ["d1", "d2", "d3"], "q2": ["d3", "d1", "d2"], "q3": ["d4"]}
    assert score_run(loaded.qrels, rankings)["ndcg@10"] == pytest.approx(1 / 3)


def test_a_corpus_id_on_several_lines_is_its_last_record(tmp_path: Path) -> None:
    """As BEIR's loader (a dict by id): the same result on every run, whichever copy was stored first."""
    corpus = [*CORPUS, {"_id": "d2", "title": "", "text": "the second copy"}, {"_id": "d1", "text": "again"}]
    loaded = load_beir(write_beir(tmp_path / "ds", corpus, {"q1": "first"}, [("q1", "d1", 1)]))
    assert [(d.id, d.content) for d in loaded.corpus] == [
        ("d1", "again"),
        ("d2", "the second copy"),
        ("d3", "text 3"),
        ("d4", "text 4"),
    ]
    assert loaded.duplicate_ids == ("d2", "d1")


def test_integer_ids_are_read_as_text(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "ds", [{"_id": 7, "title": None, "text": "seven"}], {}, [("1", "7", 1)])
    (root / "queries.jsonl").write_text('{"_id": 1, "text": "which number"}\n', encoding="utf-8")
    loaded = load_beir(root)
    assert ([d.id for d in loaded.corpus], loaded.queries) == (["7"], {"1": "which number"})


@pytest.mark.parametrize(
    ("file", "line", "message"),
    [
        (
            "queries.jsonl",
            '{"_id": "q1", "query": "first"}',
            "queries.jsonl:1: expected a string 'text', found no",
        ),
        (
            "queries.jsonl",
            '{"_id": "q1", "text": null}',
            "queries.jsonl:1: expected a string 'text', found null",
        ),
        ("queries.jsonl", '{"_id": "q1", "text": "  "}', "queries.jsonl:1: the query's 'text' is empty"),
        (
            "queries.jsonl",
            '{"_id": null, "text": "x"}',
            "queries.jsonl:1: '_id' must be a string or an integer",
        ),
        (
            "corpus.jsonl",
            '{"_id": null, "text": "x"}',
            "corpus.jsonl:1: '_id' must be a string or an integer, not null",
        ),
        (
            "corpus.jsonl",
            '{"_id": 1.5, "text": "x"}',
            "corpus.jsonl:1: '_id' must be a string or an integer, not a",
        ),
        (
            "corpus.jsonl",
            '{"_id": true, "text": "x"}',
            "corpus.jsonl:1: '_id' must be a string or an integer, not a",
        ),
        (
            "corpus.jsonl",
            '{"_id": "d1", "text": null}',
            "corpus.jsonl:1: expected a string 'text', found null",
        ),
        (
            "corpus.jsonl",
            '{"_id": "d1", "title": 5, "text": "x"}',
            "corpus.jsonl:1: 'title' must be a string",
        ),
    ],
)
def test_a_record_without_string_fields_is_refused_at_its_line(
    tmp_path: Path, file: str, line: str, message: str
) -> None:
    """Not a KeyError, nor a null searched as the text 'None' or stored under the id 'None'."""
    root = write_beir(tmp_path / "ds", CORPUS, {"q1": "first"}, [("q1", "d1", 1)])
    (root / file).write_text(line + "\n", encoding="utf-8")
    with pytest.raises(InvalidParametersError) as raised:
        load_beir(root)
    assert f"{root / file}{message.removeprefix(file)}" in raised.value.message


def test_a_qrels_file_that_is_not_utf8_is_refused_at_its_line(tmp_path: Path) -> None:
    root = write_beir(tmp_path / "ds", CORPUS, {"q1": "first"}, [("q1", "d1", 1)])
    (root / "qrels" / "test.tsv").write_bytes("query-id\tcorpus-id\tscore\nq1\td\xe91\t1\n".encode("latin-1"))
    with pytest.raises(InvalidParametersError, match=r"test\.tsv: not valid UTF-8 \(line 2, byte 29\)"):
        load_beir(root)


@pytest.mark.parametrize("file", ["corpus.jsonl", "queries.jsonl", "qrels/test.tsv"])
@pytest.mark.parametrize(
    ("bom", "encoding"), [(codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le")]
)
def test_a_file_with_a_byte_order_mark_reads_as_iris_rag_ingest_reads_it(
    tmp_path: Path, file: str, bom: bytes, encoding: str
) -> None:
    plain = load_beir(write_beir(tmp_path / "plain", CORPUS, {"q1": "first"}, [("q1", "d1", 1)]))
    root = write_beir(tmp_path / "bom", CORPUS, {"q1": "first"}, [("q1", "d1", 1)])
    (root / file).write_bytes(bom + (root / file).read_text(encoding="utf-8").encode(encoding))
    loaded = load_beir(root)
    assert (loaded.corpus, loaded.queries, loaded.qrels) == (plain.corpus, plain.queries, plain.qrels)


def test_a_corpus_without_any_text_is_refused(tmp_path: Path) -> None:
    corpus = [{"_id": "d1", "title": "", "text": ""}, {"_id": "d2", "text": "  "}]
    root = write_beir(tmp_path / "ds", corpus, {"q1": "first"}, [("q1", "d1", 1)])
    with pytest.raises(InvalidParametersError, match=r"no document in '.*corpus\.jsonl' has text"):
        load_beir(root)


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
        [("q1", "d1", 0), ("q2", "d2", 0)],  # judged, but none relevant: every measure would be 0
    ],
)
def test_a_split_with_no_judged_query_is_refused_not_scored_zero(
    tmp_path: Path, qrels: list[tuple[str, str, int]]
) -> None:
    root = write_beir(tmp_path / "ds", CORPUS, {"q1": "first", "q2": "second"}, qrels)
    with pytest.raises(InvalidParametersError, match=r"no judged queries in '.*test\.tsv' for split 'test'"):
        load_beir(root)

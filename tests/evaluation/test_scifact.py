"""SciFact (../shared/data/scifact): the loader's counts and the all-MiniLM-L6-v2 anchor. Slow: minutes."""

from __future__ import annotations

import pytest

from iris_rag.evaluation.beir import load_beir
from iris_rag.evaluation.harness import evaluate
from iris_rag.evaluation.techniques import resolve
from iris_rag.service import RagService
from tests.conftest import ROOT

SCIFACT = ROOT.parent / "shared" / "data" / "scifact"
# MTEB's all-MiniLM-L6-v2 SciFact nDCG@10 (embeddings-benchmark/mtebpaper), title + " " + text per document.
MINILM_NDCG10 = 0.645

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"SciFact is not at {SCIFACT}"),
]


def test_scifact_loads_as_published() -> None:
    test = load_beir(SCIFACT)
    assert (len(test.corpus), len(test.queries)) == (5183, 300)
    assert sum(len(docs) for docs in test.qrels.values()) == 339
    train = load_beir(SCIFACT, "train")
    assert len(train.queries) == 809
    assert not train.queries.keys() & test.queries.keys()


def test_basic_reproduces_the_minilm_anchor_on_whole_documents(service: RagService) -> None:
    # One chunk per document (20,000 characters): the encoder sees title + text cut at 256 word pieces,
    # as MTEB encodes it. Ingesting 5,183 documents takes minutes on two cores.
    dataset = load_beir(SCIFACT)
    report = evaluate(
        service,
        dataset,
        resolve("basic", service.pipelines),
        k=100,
        collection_id="eval-scifact-c20000",
        chunk_size=20000,
        progress=False,
    )
    assert report["techniques"]["basic"]["ndcg@10"] == pytest.approx(MINILM_NDCG10, abs=0.01)

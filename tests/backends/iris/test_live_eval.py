"""SciFact on a live IRIS ranks as on SQLite: the same nDCG@10 for the dense and the hybrid technique.

Runs only where an IRIS server is reachable (IRIS_HOST) and SciFact is at ../shared/data/scifact; skipped
with the reason elsewhere. Slow: it ingests SciFact's 5,183 abstracts into each store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from iris_rag.embedder import Embedder
from iris_rag.evaluation.beir import load_beir
from iris_rag.evaluation.harness import evaluate
from iris_rag.evaluation.techniques import resolve
from iris_rag.service import RagService
from iris_rag.settings import Settings
from tests.conftest import ROOT, iris_env

SCIFACT = ROOT.parent / "shared" / "data" / "scifact"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"SciFact is not at {SCIFACT}"),
]


def _ndcg(settings: Settings, embedder: Embedder) -> dict[str, float]:
    service = RagService(settings, embedder=embedder)
    try:
        dataset = load_beir(SCIFACT).limited(100)
        report = evaluate(
            service,
            dataset,
            resolve("basic,hybrid_ifind", service.pipelines),
            k=100,
            collection_id="eval-scifact-iris",
            chunk_size=settings.chunk_size,
            progress=False,
        )
        return {name: float(t["ndcg@10"]) for name, t in report["techniques"].items()}
    finally:
        service.close()


def test_scifact_ranks_the_same_on_iris_as_on_sqlite(tmp_path: Path, embedder: Embedder) -> None:
    iris: dict[str, Any] = {**iris_env(), "RAG_TECHNIQUES": "basic,hybrid_ifind", "RAG_DATA_DIR": tmp_path}
    sqlite: dict[str, Any] = {"RAG_TECHNIQUES": "basic,hybrid_ifind", "RAG_DATA_DIR": tmp_path}
    on_iris = _ndcg(Settings(**iris), embedder)
    on_sqlite = _ndcg(Settings(**sqlite), embedder)
    assert on_iris == pytest.approx(on_sqlite, abs=0.005)

"""The first call after a write, for the techniques that read the keyword index's vocabulary.

rag_crag (its evaluator's IDF, every call) and rag_hybrid_ifind with `enable_fuzzy_matching` read each
collection's whole vocabulary (term -> chunks holding it) and keep it for a data version. This bench times, in
process on an existing collection (generation off, top 5), rounds of: one new document ingested, then at once
one call of each technique (while the background index builds the ingest started run; the documents are
deleted at the end), against the same calls warm (once those builds are done, each after an untimed call of
another claim, which brings the caches up to date), alternating; rag_hybrid_ifind without fuzzy matching,
which reads no vocabulary, is the control for what else a write costs the next call. Printed: p50 / p95 ms of
each.

    RAG_DATA_DIR=data .venv/bin/python -m bench.bench_after_write --collection eval-scifact \
        --dataset ../shared/data/scifact [--rounds 20] [--calls all] [--json FILE]

With `--calls all` (and RAG_TECHNIQUES naming them), rag_noderag, rag_graphrag and rag_colbert too, and
rag_health_check with its details.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.bench_scale import call
from bench.common import machine, percentiles, read_jsonl
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings

CALLS = {
    "rag_crag": ("crag", {}),
    "rag_hybrid_ifind, fuzzy": ("hybrid_ifind", {"enable_fuzzy_matching": True}),
    "rag_hybrid_ifind (no vocabulary: the control)": ("hybrid_ifind", {}),
}
# --calls all: the techniques whose index holds more per-collection state in memory
MORE: dict[str, tuple[str, dict[str, Any]]] = {
    "rag_noderag": ("noderag", {}),
    "rag_graphrag": ("graphrag", {}),
    "rag_colbert": ("colbert", {}),
}


# --calls all: the health check with its details too (index statistics, the graph's largest component).
HEALTH = "rag_health_check, include_details"


def _call(service: RagService, name: str, query: str, collection: str) -> float:
    if name == HEALTH:
        start = time.perf_counter()
        service.health_check({"include_details": True})
        return 1000 * (time.perf_counter() - start)
    technique, params = {**CALLS, **MORE}[name]
    return call(service, technique, query, collection, params=params)


def measure(collection: str, dataset: Path, rounds: int, names: list[str]) -> dict[str, Any]:
    service = RagService(Settings())
    queries = [q["text"] for q in read_jsonl(dataset / "queries.jsonl", 3 * rounds + 10)]
    corpus = read_jsonl(dataset / "corpus.jsonl", rounds)
    for name in names:  # warm up: the models, the vocabulary of the current version
        _call(service, name, queries[-1], collection)
    warm: dict[str, list[float]] = {name: [] for name in names}
    after: dict[str, list[float]] = {name: [] for name in names}
    added = []
    for number in range(rounds):
        # Warm: once the index builds the last write started are done (each bumps the data version), an
        # untimed call first (another claim: no result cache), which brings the caches up to date.
        service.wait_for_indexes(collection, quiet=True)
        for name in names:
            _call(service, name, queries[2 * rounds + number], collection)
            warm[name].append(_call(service, name, queries[2 * number], collection))
        record = corpus[number]
        document = SourceDocument(f"after_write_{number}", record["text"], record.get("title", ""), {})
        outcome = service.ingestor.ingest(collection, [document])
        assert not outcome.errors, outcome.errors
        added.append(str(document.id))
        for name in names:
            after[name].append(_call(service, name, queries[2 * number + 1], collection))
    for document_id in added:
        service.store.delete_document(collection, document_id)
    report = {
        "machine": machine(),
        "collection": collection,
        "chunks": service.store.get_collection(collection).chunk_count,  # type: ignore[union-attr]
        "rounds": rounds,
        **{f"{name} warm_ms": percentiles(warm[name]) for name in names},
        **{f"{name} after_a_write_ms": percentiles(after[name]) for name in names},
    }
    print(json.dumps(report, indent=2))
    return report


def main() -> None:
    limit_blas_threads()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collection", default="eval-scifact")
    parser.add_argument("--dataset", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", choices=["vocabulary", "all"], default="vocabulary")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = list(CALLS) + ([*MORE, HEALTH] if args.calls == "all" else [])
    report = measure(args.collection, args.dataset, args.rounds, names)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

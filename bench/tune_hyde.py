"""rag_hyde's no-LLM parameters on a BEIR split: nDCG@10 (and the rest) of a grid, beside rag_basic.

Every setting runs through the real pipeline (`harness.rank`, as `iris-rag eval` does) on a collection
that is already ingested. Queries are the outer loop and the settings the inner one, so each query is
encoded once (the embedder remembers it) and the grid costs little more than one technique. Choose on
`--split train`, then report the choice on test with `iris-rag eval`.

    RAG_DATA_DIR=./data .venv/bin/python -m bench.tune_hyde --dataset ../shared/data/scifact \\
        --split train --collection eval-scifact --depths 1,3,5,10 --weights 0.1,0.2,0.3,0.4,0.5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import machine, write
from iris_rag.evaluation.beir import load_beir
from iris_rag.evaluation.harness import rank, validate_params
from iris_rag.evaluation.metrics import score_run
from iris_rag.evaluation.techniques import TechniqueSpec
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings


def main() -> None:
    """Rank every query with rag_basic and each (prf_depth, hypothesis_weight); print the measures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--collection", required=True)
    parser.add_argument("--depths", default="1,3,5,10")
    parser.add_argument("--weights", default="0.1,0.2,0.3,0.4,0.5")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--limit-queries", type=int, default=None)
    parser.add_argument(
        "--present-only",
        action="store_true",
        help="for a collection that holds part of the corpus: score only the queries with a relevant "
        "document in it, against the relevant documents it holds",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    limit_blas_threads()

    dataset = load_beir(args.dataset, args.split)
    if args.limit_queries:
        dataset = dataset.limited(args.limit_queries)
    specs = [TechniqueSpec("basic", "basic")]
    for depth in (int(d) for d in args.depths.split(",")):
        for weight in (float(w) for w in args.weights.split(",")):
            params = {"combine_strategy": "weighted", "hypothesis_weight": weight, "prf_depth": depth}
            specs.append(TechniqueSpec(f"hyde d={depth} w={weight}", "hyde", params))
    service = RagService(Settings())
    try:
        service.embedder.wait_ready()
        models = [validate_params(service, spec) for spec in specs]
        pipelines = [service.pipelines[spec.base] for spec in specs]
        collection = pipelines[0].resolve_collection(args.collection)
        qrels = dataset.qrels
        if args.present_only:
            present = set(service.store.document_ids(collection.id))
            qrels = {q: {d: r for d, r in rel.items() if d in present} for q, rel in qrels.items()}
            qrels = {q: rel for q, rel in qrels.items() if any(r > 0 for r in rel.values())}
        queries = {q: text for q, text in dataset.queries.items() if q in qrels}
        rankings: list[dict[str, list[str]]] = [{} for _ in specs]
        times: list[list[float]] = [[] for _ in specs]
        for query_id, text in queries.items():
            for i, (pipeline, model) in enumerate(zip(pipelines, models, strict=True)):
                started = time.perf_counter()
                rankings[i][query_id] = rank(pipeline, collection, text, query_id, args.k, model)
                times[i].append((time.perf_counter() - started) * 1000)
    finally:
        service.close()
    results: dict[str, Any] = {}
    for spec, ranking, elapsed in zip(specs, rankings, times, strict=True):
        metrics = score_run({q: qrels[q] for q in ranking}, ranking)
        results[spec.name] = {
            **{key: round(value, 5) for key, value in metrics.items()},
            "p50_ms": round(float(np.percentile(elapsed, 50)), 3),
            "params": spec.params,
        }
    write(
        args.out,
        {
            "benchmark": "rag_hyde no-LLM grid against rag_basic (the first query of each is its encode)",
            "dataset": str(args.dataset),
            "split": args.split,
            "queries": len(queries),
            "present_only": args.present_only,
            "k": args.k,
            "collection": args.collection,
            "results": results,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

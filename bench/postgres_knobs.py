"""The two PostgreSQL knobs that depend on a collection's size, measured on a bench_scale collection.

- The keyword leg alone (store.keyword_search, top 100: rag_hybrid_ifind's candidate pool; flat and
  multifield scoring): every posting read against MaxScore at each BLOCK_LOOKUP_COST given, alternating
  per query, the second of two rounds timed.
- HNSW recall@10 against exact search (bench_scale's regenerated vectors) and the vector leg's time (top
  10 and top 100), per hnsw.ef_search given (the collection-size rule of the store switched off).

    .venv/bin/python -m bench.postgres_knobs --chunks 1000000 [--lookup-costs 2,3,4] [--ef 200,400,800,1000]
        [--queries-limit 100] [--postgres-url URL] [--out FILE]

The collection must have been built by bench.bench_scale (same --chunks); the local server is the one it
keeps under bench/.data/scale/postgres unless --postgres-url names another.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_scale import collection_name, exact_top10, local_postgres, service_for
from bench.common import SCIFACT, machine, patched, percentiles, read_jsonl, write
from iris_rag.backends.postgres import store as postgres_store
from iris_rag.runtime import limit_blas_threads
from iris_rag.stores.base import KeywordQuery
from iris_rag.text import query_terms

POOL = 100  # rag_hybrid_ifind's default candidate_pool: the keyword leg's top k inside the call


def keyword_leg(service: Any, collection: str, queries: list[str], costs: list[float]) -> dict[str, Any]:
    modes: list[tuple[str, dict[str, Any]]] = [("every_posting", {"PRUNE_MIN_POSTINGS": 10**15})]
    modes += [(f"maxscore_lookup_cost_{cost:g}", {"BLOCK_LOOKUP_COST": cost}) for cost in costs]
    timings: dict[str, list[float]] = {}
    for timed in (False, True):
        for number, query in enumerate(queries):
            for scoring in ("flat", "multifield"):
                keyword_query = KeywordQuery.of(query_terms(query), 1.0, scoring)
                for label, values in modes if number % 2 == 0 else modes[::-1]:
                    ((name, value),) = values.items()
                    with patched(postgres_store, **{name: value}):
                        start = time.perf_counter()
                        service.store.keyword_search(collection, keyword_query, POOL)
                        if timed:
                            timings.setdefault(f"{scoring}_{label}", []).append(
                                (time.perf_counter() - start) * 1000
                            )
    return {label: percentiles(values) for label, values in timings.items()}


def hnsw(service: Any, chunks: int, collection: str, queries: list[str], efs: list[int]) -> dict[str, Any]:
    vectors = np.stack([service.embedder.encode_query(query) for query in queries]).astype(np.float32)
    truth = exact_top10(chunks, vectors)
    result: dict[str, Any] = {}
    for timed in (False, True):
        for ef in efs:
            found: list[float] = []
            top10: list[float] = []
            top100: list[float] = []
            with patched(postgres_store, MIN_EF_SEARCH=ef, MAX_EF_SEARCH=ef):
                for vector, expected in zip(vectors, truth, strict=True):
                    start = time.perf_counter()
                    hits = service.store.vector_search(collection, vector, 10)
                    top10.append((time.perf_counter() - start) * 1000)
                    start = time.perf_counter()
                    service.store.vector_search(collection, vector, 100)
                    top100.append((time.perf_counter() - start) * 1000)
                    found.append(len({hit.chunk_id for hit in hits} & set(expected)) / 10)
            if timed:
                result[f"ef_search_{ef}"] = {
                    "recall_at_10_mean": round(float(np.mean(found)), 4),
                    "recall_at_10_min": min(found),
                    "queries_below_0_8": sum(value < 0.8 for value in found),
                    "top10_ms": percentiles(top10),
                    "top100_ms": percentiles(top100),
                }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--lookup-costs", default="2,3,4")
    parser.add_argument("--ef", default="200,400,800,1000")
    parser.add_argument("--queries-limit", type=int, default=100)
    parser.add_argument("--postgres-url", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    limit_blas_threads()
    service = service_for("postgres", args.postgres_url or local_postgres())
    try:
        collection = collection_name(args.chunks)
        queries = [q["text"] for q in read_jsonl(SCIFACT / "queries.jsonl", args.queries_limit)]
        costs = [float(cost) for cost in args.lookup_costs.split(",") if cost]
        efs = [int(ef) for ef in args.ef.split(",") if ef]
        result = {
            "machine": machine(),
            "chunks": args.chunks,
            "keyword_leg_top100_ms": keyword_leg(service, collection, queries, costs) if costs else {},
            "hnsw": hnsw(service, args.chunks, collection, queries, efs) if efs else {},
        }
    finally:
        service.close()
    write(Path(args.out) if args.out else None, result)


if __name__ == "__main__":
    main()

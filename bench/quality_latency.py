"""rag_hybrid_ifind's call latency under several technique_params, alternating per query in one run.

    CACHE_ENABLED=false RAG_DATA_DIR=data .venv/bin/python -m bench.quality_latency \\
        --collection eval-scifact --variant default='{}' --variant rrf='{"fusion_method": "rrf"}' \\
        --out bench/results/x.json

Each query runs every variant in turn (the order rotates from query to query), so the drift of a shared
machine hits every variant alike; `RagService.execute` in process, generation off, `top_k` 5 by default.
Run with CACHE_ENABLED=false: a repeated call would otherwise be answered from the result cache.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import SCIFACT, add_query_options, machine, percentiles, read_jsonl, write
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings


def main() -> None:
    """Time each variant per query and print p50/p95 per variant and the ratio of medians to the first."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collection", required=True, help="an ingested collection (RAG_DATA_DIR's store)")
    parser.add_argument("--variant", action="append", required=True, help="NAME=<technique_params JSON>")
    add_query_options(parser, queries=SCIFACT / "queries.jsonl", queries_limit=300, warmup=5, top_k=5)
    args = parser.parse_args()
    limit_blas_threads()  # as the worker and the CLI do
    variants: dict[str, dict[str, Any]] = {}
    for item in args.variant:
        name, _, text = item.partition("=")
        variants[name] = json.loads(text)
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
    service = RagService(Settings())
    service.embedder.wait_ready()
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for i, query in enumerate(queries[: args.warmup] + queries):
            turn = names[i % len(names) :] + names[: i % len(names)]
            for name in turn:
                arguments = {
                    "query": query,
                    "collection_id": args.collection,
                    "technique_params": variants[name],
                    "options": {"top_k": args.top_k, "generate": False},
                }
                started = time.perf_counter()
                result = service.execute({"technique": "hybrid_ifind", "arguments": arguments})
                elapsed = (time.perf_counter() - started) * 1000
                assert result["success"], result
                if i >= args.warmup:
                    times[name].append(elapsed)
    finally:
        service.close()
    summary = {name: percentiles(samples) for name, samples in times.items()}
    first = summary[names[0]]["p50"]
    write(
        args.out,
        {
            "benchmark": "rag_hybrid_ifind latency per technique_params (ms, in process, generation off)",
            "collection": args.collection,
            "queries": len(queries),
            "top_k": args.top_k,
            "variants": variants,
            "latency_ms": summary,
            "p50_ratio_to_first": {name: round(summary[name]["p50"] / first, 3) for name in names},
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

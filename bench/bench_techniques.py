"""Per-technique query latency as a client sees it: the tool's own call, generation off, at given top_k.

`iris-rag eval` times each technique at its scoring depth (100 documents per query, which no client can
ask for: top_k stops at 50). This times the call a client makes: `RagService.execute` in process (the
MCP front end and bridge add their own ~1 ms, see bench_latency), `options.generate` false, on a collection
that is already ingested (for example the one `iris-rag eval` built). Queries run in file order, each
technique in turn per query, so the drift of a shared machine hits every technique alike. Each call
encodes its query: until issue 18 every technique after the first found the vector the first had left
in the embedder's memory of recent queries, and so was timed without its encode.

    .venv/bin/python -m bench.bench_techniques --collection eval-scifact \\
        --queries ../shared/data/scifact/queries.jsonl --techniques hybrid_ifind,colbert --top-k 5,50
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.common import SCIFACT, machine, percentiles, read_jsonl, write
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings


def main() -> None:
    """Time each technique at each top_k and print p50/p95 per pair."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--collection", required=True, help="an ingested collection (RAG_DATA_DIR's store)")
    parser.add_argument("--queries", type=Path, default=SCIFACT / "queries.jsonl")
    parser.add_argument("--queries-limit", type=int, default=300)
    parser.add_argument("--techniques", default="basic,hybrid_ifind,colbert")
    parser.add_argument("--top-k", default="5,50", help="comma-separated top_k values")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    limit_blas_threads()  # as the worker and the CLI do

    techniques = [t.strip() for t in args.techniques.split(",") if t.strip()]
    top_ks = [int(k) for k in args.top_k.split(",")]
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
    service = RagService(Settings())
    service.embedder.wait_ready()
    times: dict[str, list[float]] = {f"{t}@{k}": [] for t in techniques for k in top_ks}
    try:
        for i, query in enumerate(queries[: args.warmup] + queries):
            for t, technique in enumerate(techniques):
                for k, top_k in enumerate(top_ks):
                    arguments = {
                        # Trailing spaces, which the tokenizer drops: the same vector, but each call its
                        # own text, so none finds the query vector an earlier call left remembered.
                        "query": query + " " * (t * len(top_ks) + k),
                        "collection_id": args.collection,
                        "options": {"top_k": top_k, "generate": False},
                    }
                    started = time.perf_counter()
                    result = service.execute({"technique": technique, "arguments": arguments})
                    elapsed = (time.perf_counter() - started) * 1000
                    assert result["success"], result
                    if i >= args.warmup:
                        times[f"{technique}@{top_k}"].append(elapsed)
    finally:
        service.close()
    write(
        args.out,
        {
            "benchmark": "query latency per technique (ms, in process, generation off)",
            "collection": args.collection,
            "queries": len(queries),
            "latency_ms": {name: percentiles(samples) for name, samples in times.items()},
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

"""Same-run A/B of the query-time encodes of rag_hyde and rag_graphrag: old way against new, per query.

In one process, each query runs once per variant (the order rotating from query to query), so the drift of
a shared machine hits every variant alike; each variant gets its own query text (a suffix), so no variant
finds a vector another one left in the embedder's memory of recent queries. Generation off, top_k 5.

- hyde: the first pass's sentences encoded in one batch (64, the embedder's default: before) or 4 at a time
  (`QUERY_TIME_BATCH`: after). Since issue 18 the no-LLM hypothesis encodes no sentences (it averages the
  first pass's stored vectors), so both hyde variants now time the same code; kept for the record;
- graphrag: the query and its phrases in one batch (before), each as a query of its own (tried), or the
  query as a query beside one batch of the phrases (after).

    .venv/bin/python -m bench.ab_query_encodes --data-dir DIR --collection NAME [--queries-limit 22]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import iris_rag.techniques.hyde as hyde_module
from bench.common import SAMPLE, add_query_options, machine, percentiles, read_jsonl, write
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.graphrag.pipeline import GraphRagPipeline

Vectors = npt.NDArray[np.float32]
Encode = Callable[[GraphRagPipeline, str, list[str]], tuple[Vectors, Vectors]]


def graph_variants(service: RagService) -> dict[str, Encode]:
    """The three ways rag_graphrag can encode a query and its phrases."""
    embedder = service.embedder
    empty = np.zeros((0, embedder.dimension), dtype=np.float32)

    def one_batch(_: GraphRagPipeline, query: str, phrases: list[str]) -> tuple[Vectors, Vectors]:
        vectors = embedder.encode([query, *phrases])
        return vectors[0], vectors[1:]

    def each_as_query(_: GraphRagPipeline, query: str, phrases: list[str]) -> tuple[Vectors, Vectors]:
        vectors = [f.result() for f in [embedder.encode_query_async(t) for t in [query, *phrases]]]
        return vectors[0], np.stack(vectors[1:]) if phrases else empty

    return {
        "before_one_batch": one_batch,
        "tried_each_as_query": each_as_query,
        "after_query_beside_phrase_batch": GraphRagPipeline._encode,
    }


def main() -> None:
    """Time each variant on the same queries and print percentiles and the paired ratio to before."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--collection", required=True)
    add_query_options(parser, queries=SAMPLE / "queries.jsonl", queries_limit=22, warmup=2)
    args = parser.parse_args()
    limit_blas_threads()
    service = RagService(Settings(RAG_DATA_DIR=args.data_dir))
    service.embedder.wait_ready()
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
    original_encode, original_batch = GraphRagPipeline._encode, hyde_module.QUERY_TIME_BATCH
    graph = graph_variants(service)

    def use_encode(encode: Encode) -> Callable[[], None]:
        return lambda: setattr(GraphRagPipeline, "_encode", encode)

    def use_batch(size: int) -> Callable[[], None]:
        return lambda: setattr(hyde_module, "QUERY_TIME_BATCH", size)

    setups: dict[str, tuple[str, Callable[[], None]]] = {
        **{f"graphrag_{name}": ("graphrag", use_encode(encode)) for name, encode in graph.items()},
        "hyde_before_batch_64": ("hyde", use_batch(64)),
        "hyde_after_batch_4": ("hyde", use_batch(original_batch)),
    }
    times: dict[str, list[float]] = {name: [] for name in setups}
    try:
        for technique in ("graphrag", "hyde"):
            names = [name for name, (t, _) in setups.items() if t == technique]
            for i, query in enumerate(queries):
                shift = i % len(names)
                for name in names[shift:] + names[:shift]:
                    setups[name][1]()
                    arguments: dict[str, Any] = {
                        "query": f"{query} [{name}]",
                        "collection_id": args.collection,
                        "options": {"top_k": 5, "generate": False},
                    }
                    started = time.perf_counter()
                    service.execute({"technique": technique, "arguments": arguments})
                    if i >= args.warmup:
                        times[name].append((time.perf_counter() - started) * 1000)
    finally:
        GraphRagPipeline._encode = original_encode  # type: ignore[method-assign]
        hyde_module.QUERY_TIME_BATCH = original_batch
        service.close()

    def ratio(name: str, base: str) -> float:
        return round(statistics.median(a / b for a, b in zip(times[name], times[base], strict=True)), 3)

    write(
        args.out,
        {
            "benchmark": "query-time encodes, old against new in one run (ms, generation off, top_k 5)",
            "collection": args.collection,
            "latency_ms": {name: percentiles(samples) for name, samples in times.items()},
            "paired_ratio_p50": {
                "graphrag_tried_each_as_query": ratio(
                    "graphrag_tried_each_as_query", "graphrag_before_one_batch"
                ),
                "graphrag_after": ratio(
                    "graphrag_after_query_beside_phrase_batch", "graphrag_before_one_batch"
                ),
                "hyde_after": ratio("hyde_after_batch_4", "hyde_before_batch_64"),
            },
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

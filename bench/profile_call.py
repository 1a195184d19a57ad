"""Where one technique call's time goes, in the worker: a span per step, medians over many queries.

The steps are timed by wrapping the real objects' methods (the store, the embedder, the generator, the
pipeline's own steps) for the length of the run, so nothing in iris_rag carries timing code. Each query
runs the whole call the way the worker does: `RagService.execute` and the answer line's encoding
(`worker/protocol.success_line`); "other" is what no span covers (the template's own bookkeeping, the
response dict). Spans nest (query_similarities holds a vector_scores), so the table says which are inside
which. The front end, the bridge pipes and an MCP client are timed by bench_latency (paired differences).

    .venv/bin/python -m bench.profile_call --data-dir DIR --collection NAME [--technique basic]
        [--queries FILE] [--queries-limit N] [--generate/--no-generate] [--top-k 5] [--cprofile N]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench.common import SAMPLE, add_query_options, machine, percentiles, read_jsonl, write
from iris_rag import pipeline as pipeline_module
from iris_rag import service as service_module
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.worker.protocol import success_line


class Spans:
    """Milliseconds per named span, summed within one call and collected per call."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.calls: list[dict[str, float]] = []

    @contextmanager
    def wrap(self, owner: Any, attribute: str, name: str) -> Iterator[None]:
        """Time every call of owner.attribute as `name` until the block ends."""
        original: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.current[name] += (time.perf_counter() - started) * 1000

        setattr(owner, attribute, timed)
        try:
            yield
        finally:
            # An instance attribute is removed (the class's method shows again); a module one is restored.
            if isinstance(owner, type) or not hasattr(type(owner), attribute):
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)

    def finish(self, total_ms: float) -> None:
        """Close one call's spans."""
        self.current["total"] = total_ms
        self.calls.append(dict(self.current))
        self.current = defaultdict(float)


# (owner attribute path, method, span name, what it holds)
def instrument(service: RagService, technique: str, spans: Spans, stack: ExitStack) -> dict[str, str]:
    """Wrap the steps of one technique's call; returns each span's description."""
    pipeline = service.pipelines[technique]
    steps: list[tuple[Any, str, str, str]] = [
        (service_module, "validate_arguments", "validate_arguments", "the tool's JSON Schema (jsonschema)"),
        (pipeline_module.TechniqueRequest, "model_validate", "request_model", "pydantic TechniqueRequest"),
        (pipeline, "resolve_collection", "resolve_collection", "get_collection: one SQL row with counts"),
        (pipeline, "retrieve", "retrieve", "the technique's retrieve() (holds the spans below it)"),
        (service.embedder, "encode_query", "  encode_query", "the query's embedding (MiniLM, one thread)"),
        (service.embedder, "encode", "  encode", "other encodes (batches: phrases, sentences)"),
        (service.embedder, "word_piece_counts", "  word_piece_counts", "tokenizer counts (encode thread)"),
        (service.store, "vector_search", "  vector_search", "matrix @ query, top k"),
        (service.store, "get_chunks", "  get_chunks", "the chunks' rows by id (SQL)"),
        (service.store, "chunk_count", "  chunk_count", "documents_searched"),
        (pipeline, "query_similarities", "query_similarities", "cosine per result, for the answer's floor"),
        (service.store, "vector_scores", "  vector_scores", "cosine of given chunks (in retrieve too)"),
        (pipeline, "generate", "generate", "the answer (extractive without an LLM)"),
    ]
    described = {}
    for owner, attribute, name, description in steps:
        if hasattr(owner, attribute):
            stack.enter_context(spans.wrap(owner, attribute, name))
            described[name] = description
    return described


def main() -> None:
    """Run the call over the queries with every span timed, then print medians (and a cProfile)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="RAG_DATA_DIR with the collection")
    parser.add_argument("--collection", required=True)
    parser.add_argument("--technique", default="basic")
    add_query_options(parser, queries=SAMPLE / "queries.jsonl", queries_limit=100, warmup=5, top_k=5)
    parser.add_argument("--generate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--cprofile", type=int, default=0, help="also print the N costliest functions")
    args = parser.parse_args()
    os.environ["RAG_DATA_DIR"] = str(args.data_dir)
    limit_blas_threads()  # as the worker does

    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
    service = RagService(Settings(RAG_DATA_DIR=args.data_dir))
    service.embedder.wait_ready()
    spans = Spans()
    profiler = cProfile.Profile() if args.cprofile else None
    try:
        with ExitStack() as stack:
            described = instrument(service, args.technique, spans, stack)
            for i, query in enumerate(queries[: args.warmup] + queries):
                call = {
                    "technique": args.technique,
                    "arguments": {
                        "query": query,
                        "collection_id": args.collection,
                        "options": {"top_k": args.top_k, "generate": args.generate},
                    },
                }
                if profiler is not None and i >= args.warmup:
                    profiler.enable()
                started = time.perf_counter()
                result = service.execute(call)
                encoded = time.perf_counter()
                success_line(i, result)
                finished = time.perf_counter()
                if profiler is not None:
                    profiler.disable()
                spans.current["success_line"] = (finished - encoded) * 1000
                if i >= args.warmup:
                    spans.finish((finished - started) * 1000)
                else:
                    spans.current.clear()
    finally:
        service.close()

    described["success_line"] = "the answer line's JSON (orjson)"
    names = ["total", *described]
    table = {}
    for name in names:
        samples = [call.get(name, 0.0) for call in spans.calls]
        if any(samples):
            table[name.strip()] = {**percentiles(samples), "what": described.get(name, "the whole call")}
    top_level = [n for n in described if not n.startswith(" ")]
    other = [call["total"] - sum(call.get(n, 0.0) for n in top_level) for call in spans.calls]
    table["other"] = {**percentiles(other), "what": "not in any top-level span"}
    report: dict[str, Any] = {
        "benchmark": f"{args.technique} call, span by span (ms, in the worker, top_k {args.top_k}, "
        f"generate {args.generate})",
        "collection": args.collection,
        "queries": len(spans.calls),
        "spans_ms": table,
        "machine": machine(),
    }
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(args.cprofile)
        report["cprofile"] = text.getvalue().splitlines()
    write(args.out, report)


if __name__ == "__main__":
    main()

"""Slow work against fast work, through the real MCP server: rag_basic latency idle and during an ingest,
and each technique's first call right after a fresh ingest.

1. A fresh server (official MCP client over stdio, every technique served, generation off) on a fresh
   data folder ingests a base collection, then times rag_basic `--calls` times while idle; then starts one
   rag_ingest of `--ingest-docs` other SciFact documents into a second collection and, in the same run,
   times rag_basic again while that ingest runs. Prints p50/p95 of both and the ratio of the medians
   (issue 11's target: at most 2x idle).
2. A fresh server process on the same folder loads its model (one rag_basic call on the base collection),
   then calls each technique twice on the collection the ingest just wrote (no technique has read it
   yet): first-call and second-call latency per technique. Any call is
   bounded by `--call-timeout` (a call that hits it is reported as such, not waited for).

    .venv/bin/python -m bench.bench_contention --corpus ../shared/data/scifact/corpus.jsonl \\
        --queries ../shared/data/scifact/queries.jsonl
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.common import ROOT, SCIFACT, machine, percentiles, read_jsonl, write
from iris_rag.schemas import technique_tools

SERVER = ROOT / "mcp-server" / "dist" / "index.js"
BASE = "bench-base"
LOADED = "bench-ingest"


def documents(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BEIR records as rag_ingest documents."""
    return [{"id": str(r["_id"]), "title": r.get("title", ""), "content": r["text"]} for r in records]


def query_arguments(query: str, collection: str) -> dict[str, Any]:
    """A rag_basic call as the other benches make it: top_k 5, generation off."""
    return {"query": query, "collection_id": collection, "options": {"top_k": 5, "generate": False}}


async def open_session(stack: AsyncExitStack, data_dir: Path, bound_s: float) -> ClientSession:
    """A fresh server process on data_dir, its own request timeout above the bench's bounds."""
    env = {
        **os.environ,
        "RAG_DATA_DIR": str(data_dir),
        "LOG_LEVEL": "WARNING",
        "LLM_PROVIDER": "none",
        "REQUEST_TIMEOUT_MS": str(int(bound_s * 1000) + 60_000),
    }
    env.pop("RAG_TECHNIQUES", None)
    params = StdioServerParameters(command="node", args=[str(SERVER)], env=env, cwd=ROOT)
    read, write_stream = await stack.enter_async_context(stdio_client(params))
    session = await stack.enter_async_context(ClientSession(read, write_stream))
    await session.initialize()
    await session.list_tools()
    return session


async def timed_call(
    session: ClientSession, tool: str, arguments: dict[str, Any], timeout_s: float
) -> float | None:
    """Milliseconds for one call (it must succeed), or None when it outlasts timeout_s."""
    started = time.perf_counter()
    with anyio.move_on_after(timeout_s):
        result = await session.call_tool(tool, arguments)
        assert not result.isError, result.content
        return (time.perf_counter() - started) * 1000
    return None


async def contention(
    data_dir: Path, base: list[dict[str, Any]], load: list[dict[str, Any]], queries: list[str], args: Any
) -> dict[str, Any]:
    """rag_basic idle, then during one rag_ingest of `load`, in one server process."""
    async with AsyncExitStack() as stack:
        session = await open_session(stack, data_dir, max(args.call_timeout, args.ingest_timeout, 1800))
        ingested = await timed_call(session, "rag_ingest", {"collection_id": BASE, "documents": base}, 1800)
        assert ingested is not None
        for query in queries[: args.warmup]:
            await timed_call(session, "rag_basic", query_arguments(query, BASE), args.call_timeout)
        idle = [
            t
            for query in queries[: args.calls]
            if (t := await timed_call(session, "rag_basic", query_arguments(query, BASE), args.call_timeout))
        ]

        busy: list[float] = []
        timed_out = 0
        ingest_ms: list[float | None] = []

        async def ingest() -> None:
            arguments = {"collection_id": LOADED, "documents": load}
            ingest_ms.append(await timed_call(session, "rag_ingest", arguments, args.ingest_timeout))

        async with anyio.create_task_group() as group:
            group.start_soon(ingest)
            await anyio.sleep(0.5)  # let the ingest start its work
            position = 0
            while not ingest_ms:
                query = queries[position % len(queries)]
                position += 1
                elapsed = await timed_call(
                    session, "rag_basic", query_arguments(query, BASE), args.call_timeout
                )
                if elapsed is None:
                    timed_out += 1
                elif not ingest_ms:  # only calls that ran entirely during the ingest count
                    busy.append(elapsed)
    idle_stats = percentiles(idle)
    busy_stats = percentiles(busy) if busy else {"p50": None, "p95": None, "n": 0}
    ratio = round(busy_stats["p50"] / idle_stats["p50"], 2) if busy_stats["p50"] else None
    return {
        "base_documents": len(base),
        "ingest_documents": len(load),
        "ingest_ms": None if ingest_ms[0] is None else round(ingest_ms[0], 1),
        "rag_basic_idle_ms": idle_stats,
        "rag_basic_during_ingest_ms": busy_stats,
        "rag_basic_timed_out_during_ingest": timed_out,
        "median_ratio_during_over_idle": ratio,
        "target_ratio": 2.0,
    }


async def first_calls(data_dir: Path, queries: list[str], args: Any) -> dict[str, Any]:
    """Each technique's first and second call on the freshly ingested collection, in a fresh server."""
    techniques = sorted(technique_tools())
    results: dict[str, Any] = {}
    async with AsyncExitStack() as stack:
        session = await open_session(stack, data_dir, args.call_timeout)
        # The model loads on the first query: pay that on the base collection, not in a technique's figure.
        await timed_call(session, "rag_basic", query_arguments(queries[0], BASE), 600)
        for position, technique in enumerate(techniques):
            tool = technique_tools()[technique]
            query = queries[position % len(queries)]
            first = await timed_call(session, tool, query_arguments(query, LOADED), args.call_timeout)
            second = await timed_call(session, tool, query_arguments(query, LOADED), args.call_timeout)
            results[tool] = {
                "first_ms": None if first is None else round(first, 1),
                "second_ms": None if second is None else round(second, 1),
                "timed_out": first is None,
            }
            print(tool, results[tool], flush=True)
    return {
        "order": [technique_tools()[t] for t in techniques],
        "call_timeout_s": args.call_timeout,
        **results,
    }


def main() -> None:
    """Run both parts and print (and save) the figures."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=SCIFACT / "corpus.jsonl")
    parser.add_argument("--queries", type=Path, default=SCIFACT / "queries.jsonl")
    parser.add_argument("--base-docs", type=int, default=100, help="documents of the collection queried")
    parser.add_argument("--ingest-docs", type=int, default=300, help="documents of the concurrent ingest")
    parser.add_argument("--calls", type=int, default=40, help="idle rag_basic calls timed")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--call-timeout", type=float, default=120.0, help="bound on any query call (s)")
    parser.add_argument("--ingest-timeout", type=float, default=900.0, help="bound on the ingest call (s)")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a fresh temporary folder")
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "contention.json")
    args = parser.parse_args()
    assert SERVER.is_file(), f"{SERVER} is missing: run `npm run build` first"

    records = read_jsonl(args.corpus, args.base_docs + args.ingest_docs)
    base, load = documents(records[: args.base_docs]), documents(records[args.base_docs :])
    queries = [q["text"] for q in read_jsonl(args.queries)]
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench-contention-"))
    try:
        started = time.perf_counter()
        under_load = anyio.run(contention, data_dir, base, load, queries, args)
        print("contention", under_load, flush=True)
        cold = anyio.run(first_calls, data_dir, queries, args)
        result = {
            "machine": machine(),
            "corpus": str(args.corpus),
            "contention": under_load,
            "first_call_after_ingest": cold,
            "wall_s": round(time.perf_counter() - started, 1),
        }
    finally:
        if args.data_dir is None and not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    write(args.out, result)


if __name__ == "__main__":
    main()

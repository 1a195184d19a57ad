"""rag_basic latency three ways, on the same queries and the same store:

1. direct: RagService.execute in this Python process;
2. worker: the Python worker over JSON lines (the bridge alone, no Node);
3. mcp: the real MCP server over stdio, called by the official Python MCP client.

mcp - direct is what the front end, the bridge and the client cost per call. Also: how long the worker takes
to give its first answer after it is started.

    .venv/bin/python -m bench.bench_latency [--corpus FILE --queries FILE] [--queries-limit N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import orjson
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.common import ROOT, SAMPLE, machine, median, percentiles, read_jsonl, write
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.service import RagService
from iris_rag.settings import Settings

COLLECTION = "bench"


def prepare(data_dir: Path, corpus: Path) -> None:
    """Ingest the corpus once; later runs reuse the stored collection."""
    service = RagService(Settings(RAG_DATA_DIR=data_dir))
    try:
        if service.store.get_collection(COLLECTION) is None:
            records = read_jsonl(corpus)
            service.embedder.wait_ready()
            for i in range(0, len(records), 256):
                batch = [
                    SourceDocument(r["_id"], r["text"], r.get("title", ""), {}) for r in records[i : i + 256]
                ]
                service.ingestor.ingest(COLLECTION, batch)
                print(f"ingested {min(i + 256, len(records))}/{len(records)}", file=sys.stderr)
    finally:
        service.close()


def arguments(query: str) -> dict[str, Any]:
    """The rag_basic call every path makes (extractive answer, top 5)."""
    return {"query": query, "collection_id": COLLECTION, "options": {"top_k": 5}}


def run_direct(data_dir: Path, queries: list[str], warmup: int) -> list[float]:
    """Time RagService.execute in-process."""
    service = RagService(Settings(RAG_DATA_DIR=data_dir))
    service.embedder.wait_ready()
    times = []
    for i, query in enumerate(queries[:warmup] + queries):
        started = time.perf_counter()
        service.execute({"technique": "basic", "arguments": arguments(query)})
        if i >= warmup:
            times.append((time.perf_counter() - started) * 1000)
    service.close()
    return times


def _worker(data_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAG_DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING"}
    return subprocess.Popen(
        [sys.executable, "-m", "iris_rag.bridge"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def _round_trip(worker: subprocess.Popen[bytes], request_id: int, method: str, params: dict[str, Any]) -> Any:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(orjson.dumps({"id": request_id, "method": method, "params": params}) + b"\n")
    worker.stdin.flush()
    response = orjson.loads(worker.stdout.readline())
    assert response["id"] == request_id and response["success"], response
    return response["result"]


def run_worker(data_dir: Path, queries: list[str], warmup: int) -> tuple[list[float], list[float]]:
    """Time calls over JSON lines to a worker subprocess; also its first-answer times."""
    first_answers = []
    for _ in range(3):
        started = time.perf_counter()
        worker = _worker(data_dir)
        _round_trip(worker, 0, "describe", {})
        first_answers.append((time.perf_counter() - started) * 1000)
        worker.kill()
        worker.wait()
    worker = _worker(data_dir)
    times = []
    for i, query in enumerate(queries[:warmup] + queries):
        started = time.perf_counter()
        _round_trip(worker, i + 1, "execute", {"technique": "basic", "arguments": arguments(query)})
        if i >= warmup:
            times.append((time.perf_counter() - started) * 1000)
    worker.kill()
    worker.wait()
    return times, first_answers


async def run_mcp(data_dir: Path, queries: list[str], warmup: int) -> list[float]:
    """Time tools/call rag_basic through `node mcp-server/dist/index.js` with the Python MCP client."""
    server = StdioServerParameters(
        command="node",
        args=[str(ROOT / "mcp-server" / "dist" / "index.js")],
        env={**os.environ, "RAG_DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING"},
        cwd=str(ROOT),
    )
    times = []
    async with stdio_client(server) as (read, write_stream), ClientSession(read, write_stream) as session:
        await session.initialize()
        for i, query in enumerate(queries[:warmup] + queries):
            started = time.perf_counter()
            result = await session.call_tool("rag_basic", arguments(query))
            if i >= warmup:
                times.append((time.perf_counter() - started) * 1000)
            assert not result.isError, result.content
    return times


def main() -> None:
    """Run the three paths and print medians and the front end's cost."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=SAMPLE / "corpus.jsonl")
    parser.add_argument("--queries", type=Path, default=SAMPLE / "queries.jsonl")
    parser.add_argument("--queries-limit", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: bench/.data/<corpus folder>")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    data_dir = args.data_dir or ROOT / "bench" / ".data" / args.corpus.parent.name
    prepare(data_dir, args.corpus)
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]

    direct = run_direct(data_dir, queries, args.warmup)
    worker, first_answers = run_worker(data_dir, queries, args.warmup)
    mcp = anyio.run(run_mcp, data_dir, queries, args.warmup)
    direct_p, worker_p, mcp_p = percentiles(direct), percentiles(worker), percentiles(mcp)
    write(
        args.out,
        {
            "benchmark": "rag_basic latency (ms, extractive answer, top_k 5)",
            "corpus": str(args.corpus),
            "queries": len(queries),
            "direct_python": direct_p,
            "worker_json_lines": worker_p,
            "mcp_stdio": mcp_p,
            "bridge_overhead_p50_ms": round(worker_p["p50"] - direct_p["p50"], 3),
            "front_end_and_bridge_overhead_p50_ms": round(mcp_p["p50"] - direct_p["p50"], 3),
            "worker_first_answer_ms": {
                "median": median(first_answers),
                "runs": [round(t) for t in first_answers],
            },
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

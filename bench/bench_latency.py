"""rag_basic latency four ways, on the same queries and the same store:

1. direct: RagService.execute in this Python process;
2. worker: the Python worker over JSON lines (the bridge alone, no Node);
3. mcp_raw: the real MCP server over stdio, called with bare JSON-RPC lines (no client library);
4. mcp_client: the same server called by the official Python MCP client, which also validates every result
   against the tool's outputSchema with jsonschema (a cost of that client, not of this server).

Each query goes through all four in turn, and overheads are medians of the paired differences, so the
drift of a shared machine cancels out. Also: how long a worker takes to give its first answer.

    .venv/bin/python -m bench.bench_latency [--corpus FILE --queries FILE] [--queries-limit N]
        [--data-dir DIR --collection NAME]   (reuse a collection already ingested there, e.g. by eval)
"""

from __future__ import annotations

import argparse
import contextlib
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

from bench.common import ROOT, SAMPLE, add_query_options, machine, median, percentiles, read_jsonl, write
from iris_rag.ingestion.loaders import SourceDocument
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings

COLLECTION = "bench"
PATHS = ["worker", "mcp_raw", "mcp_client"]


def prepare(data_dir: Path, corpus: Path, collection: str) -> None:
    """Ingest the corpus once; later runs reuse the stored collection."""
    service = RagService(Settings(RAG_DATA_DIR=data_dir))
    try:
        if service.store.get_collection(collection) is None:
            records = read_jsonl(corpus)
            service.embedder.wait_ready()
            for i in range(0, len(records), 256):
                batch = [
                    SourceDocument(r["_id"], r["text"], r.get("title", ""), {}) for r in records[i : i + 256]
                ]
                service.ingestor.ingest(collection, batch)
                print(f"ingested {min(i + 256, len(records))}/{len(records)}", file=sys.stderr)
    finally:
        service.close()


def arguments(query: str, collection: str) -> dict[str, Any]:
    """The rag_basic call every path makes (extractive answer, top 5)."""
    return {"query": query, "collection_id": collection, "options": {"top_k": 5}}


class JsonLinesProcess:
    """A subprocess answering one JSON object per line (the worker, or the MCP server as raw JSON-RPC)."""

    def __init__(self, command: list[str], data_dir: Path) -> None:
        env = {**os.environ, "RAG_DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING"}
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.next_id = 0

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(orjson.dumps(message) + b"\n")
        self.process.stdin.flush()

    def request(self, message: dict[str, Any]) -> Any:
        self.next_id += 1
        self.send({**message, "id": self.next_id})
        assert self.process.stdout is not None
        while True:
            response = orjson.loads(self.process.stdout.readline())
            if response.get("id") == self.next_id and "event" not in response:  # not a progress event
                return response

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def worker_call(worker: JsonLinesProcess, method: str, params: dict[str, Any]) -> Any:
    """One bridge request; the result or an AssertionError."""
    response = worker.request({"method": method, "params": params})
    assert response["success"], response
    return response["result"]


def raw_mcp_call(server: JsonLinesProcess, name: str, args: dict[str, Any]) -> Any:
    """tools/call as bare JSON-RPC: the server's cost without any client library's."""
    response = server.request(
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": name, "arguments": args}}
    )
    assert not response["result"].get("isError"), response
    return response["result"]


def first_answer_times(data_dir: Path, runs: int = 3) -> list[float]:
    """Milliseconds from starting a worker to its answer to describe."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        worker = JsonLinesProcess([sys.executable, "-m", "iris_rag.bridge"], data_dir)
        worker_call(worker, "describe", {})
        times.append((time.perf_counter() - started) * 1000)
        worker.close()
    return times


async def measure(
    data_dir: Path, collection: str, queries: list[str], warmup: int, paths: list[str]
) -> dict[str, list[float]]:
    """Call rag_basic on every path for each query in turn, so drift on a shared machine hits all alike."""
    service = RagService(Settings(RAG_DATA_DIR=data_dir))
    service.embedder.wait_ready()
    node = ["node", str(ROOT / "mcp-server" / "dist" / "index.js")]
    env = {**os.environ, "RAG_DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING"}
    times: dict[str, list[float]] = {path: [] for path in ["direct", *paths]}
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(service.close)
        if "worker" in paths:
            worker = JsonLinesProcess([sys.executable, "-m", "iris_rag.bridge"], data_dir)
            stack.callback(worker.close)
        if "mcp_raw" in paths:
            raw = JsonLinesProcess(node, data_dir)
            stack.callback(raw.close)
            raw.request(
                {
                    "jsonrpc": "2.0",
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "bench", "version": "0"},
                    },
                }
            )
            raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if "mcp_client" in paths:
            server = StdioServerParameters(command=node[0], args=node[1:], env=env)
            read, write_stream = await stack.enter_async_context(stdio_client(server))
            session = await stack.enter_async_context(ClientSession(read, write_stream))
            await session.initialize()
            await session.list_tools()  # the client validates results against the listed outputSchema

        for i, query in enumerate(queries[:warmup] + queries):
            args = arguments(query, collection)
            for path in times:
                started = time.perf_counter()
                if path == "direct":
                    service.execute({"technique": "basic", "arguments": args})
                elif path == "worker":
                    worker_call(worker, "execute", {"technique": "basic", "arguments": args})
                elif path == "mcp_raw":
                    raw_mcp_call(raw, "rag_basic", args)
                else:
                    result = await session.call_tool("rag_basic", args)
                    assert not result.isError, result.content
                if i >= warmup:
                    times[path].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    """Run the three paths and print medians and the front end's cost."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=SAMPLE / "corpus.jsonl")
    add_query_options(parser, queries=SAMPLE / "queries.jsonl", queries_limit=100, warmup=5)
    parser.add_argument("--data-dir", type=Path, default=None, help="default: bench/.data/<corpus folder>")
    parser.add_argument("--collection", default=COLLECTION, help="ingested from --corpus if absent")
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="paths besides direct (fewer processes: less contention on a small machine)",
    )
    args = parser.parse_args()
    limit_blas_threads()  # as the worker and the CLI do

    data_dir = (
        args.data_dir
        or ROOT / "bench" / ".data" / f"{args.corpus.parent.parent.name}-{args.corpus.parent.name}"
    )
    prepare(data_dir, args.corpus, args.collection)
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]

    paths = [path for path in PATHS if path in args.paths.split(",")]
    times = anyio.run(measure, data_dir, args.collection, queries, args.warmup, paths)
    first_answers = first_answer_times(data_dir)

    def paired_median(path: str, base: str = "direct") -> float:
        return median([t - d for t, d in zip(times[path], times[base], strict=True)])

    overheads = {
        name: paired_median(path, base)
        for name, path, base in [
            ("worker_bridge", "worker", "direct"),
            ("front_end_and_bridge", "mcp_raw", "direct"),
            ("front_end_alone", "mcp_raw", "worker"),
            ("front_end_bridge_and_python_mcp_client", "mcp_client", "direct"),
        ]
        if path in times and base in times
    }

    write(
        args.out,
        {
            "benchmark": "rag_basic latency (ms, extractive answer, top_k 5)",
            "corpus": str(args.corpus),
            "collection": args.collection,
            "queries": len(queries),
            **{path: percentiles(samples) for path, samples in times.items()},
            "overhead_p50_ms": overheads,
            "worker_first_answer_ms": {
                "median": median(first_answers),
                "runs": [round(t) for t in first_answers],
            },
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

"""Many HTTP clients at once: the server in MCP_TRANSPORT=http, N sessions calling mixed techniques for T s.

Each client is its own MCP session over Streamable HTTP with its own API key (RAG_AUTH_FILE), sending
tools/call requests back to back (bare JSON-RPC over httpx: the official client's result validation would
spend the bench's own CPU on a 2-core machine) with a random technique and SciFact query each time. The last
client's key has a requests_per_minute limit, so configured rate limits show up as the only errors allowed.

    .venv/bin/python -m bench.bench_http --data-dir DIR --collection NAME --queries FILE
        [--clients 50] [--seconds 60] [--techniques basic,hybrid_ifind,hyde,crag] [--out FILE]

The collection must already be ingested in DIR (for example by `iris-rag eval`); the server serves only the
techniques named, so no other index is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench.common import ROOT, add_query_options, machine, percentiles, read_jsonl, write

READY = re.compile(r"MCP server ready on (http://\S+)/mcp")
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
LIMITED_RATE = 6  # calls per minute for the one rate-limited client (below what it would send)


def start_server(env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """The built server in HTTP mode on a free port; its URL once it says it is ready."""
    process = subprocess.Popen(
        ["node", str(ROOT / "mcp-server" / "dist" / "index.js")],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            match = READY.search(line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    ready.wait(120)
    if not found:
        process.kill()
        sys.exit("the server did not start")
    return process, found[0]


def sse_result(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a tools/call answer (an SSE stream or plain JSON)."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: "):
                message: dict[str, Any] = json.loads(line[6:])
                if "id" in message:
                    return message
        raise ValueError("no JSON-RPC answer in the event stream")
    answer: dict[str, Any] = response.json()
    return answer


async def client(
    url: str, key: str, queries: list[str], techniques: list[str], collection: str, until: float, seed: int
) -> tuple[dict[str, list[float]], Counter[str]]:
    """One session: initialize, then calls until the deadline; (ms of successes per technique, outcomes)."""
    rng = random.Random(seed)
    latencies: dict[str, list[float]] = {t: [] for t in techniques}
    outcomes: Counter[str] = Counter()
    headers = {**ACCEPT, "Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=120, headers=headers) as http:
        initialize = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "b", "version": "0"},
            },
        }
        opened = await http.post(f"{url}/mcp", json=initialize)
        opened.raise_for_status()
        http.headers["mcp-session-id"] = opened.headers["mcp-session-id"]
        http.headers["mcp-protocol-version"] = "2025-06-18"
        await http.post(f"{url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        number = 0
        while time.monotonic() < until:
            number += 1
            technique = rng.choice(techniques)
            arguments = {"query": rng.choice(queries), "collection_id": collection, "options": {"top_k": 5}}
            call = {
                "jsonrpc": "2.0",
                "id": number,
                "method": "tools/call",
                "params": {"name": f"rag_{technique}", "arguments": arguments},
            }
            started = time.perf_counter()
            try:
                message = sse_result(await http.post(f"{url}/mcp", json=call))
            except (httpx.HTTPError, ValueError) as error:
                outcomes[f"http:{type(error).__name__}"] += 1
                continue
            elapsed = (time.perf_counter() - started) * 1000
            result = message.get("result", {})
            if "error" in message:
                outcomes[f"jsonrpc:{message['error'].get('code')}"] += 1
            elif result.get("isError"):
                failure = json.loads(result["content"][0]["text"])["error"]
                code = failure["code"]
                outcomes[code] += 1
                if code != "RATE_LIMIT_EXCEEDED" and outcomes[code] == 1:
                    print(f"{code}: {failure['message'][:300]}", file=sys.stderr)
                if code == "RATE_LIMIT_EXCEEDED":
                    await asyncio.sleep(0.5)  # a polite client backs off
            else:
                outcomes["ok"] += 1
                latencies[technique].append(elapsed)
    return latencies, outcomes


async def run(url: str, keys: list[str], args: argparse.Namespace, queries: list[str]) -> dict[str, Any]:
    techniques = args.techniques.split(",")
    until = time.monotonic() + args.seconds
    started = time.monotonic()
    results = await asyncio.gather(
        *(
            client(url, key, queries, techniques, args.collection, until, seed)
            for seed, key in enumerate(keys)
        )
    )
    wall = time.monotonic() - started
    latencies = [ms for found, _ in results for samples in found.values() for ms in samples]
    by_technique = {t: percentiles([ms for found, _ in results for ms in found[t]]) for t in techniques}
    outcomes: Counter[str] = sum((found for _, found in results), Counter())
    errors = {k: v for k, v in outcomes.items() if k not in ("ok", "RATE_LIMIT_EXCEEDED")}
    return {
        "clients": len(keys),
        "seconds": round(wall, 1),
        "calls_ok": outcomes["ok"],
        "throughput_per_s": round(outcomes["ok"] / wall, 2),
        "latency_ms": percentiles(latencies),
        "latency_ms_by_technique": by_technique,
        "rate_limited": outcomes["RATE_LIMIT_EXCEEDED"],
        "other_errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--collection", required=True)
    add_query_options(parser, queries=None, queries_limit=300)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--techniques", default="basic,hybrid_ifind,hyde,crag")
    args = parser.parse_args()
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
    keys = [f"bench-key-{i}" for i in range(args.clients)]
    principals = [
        {
            "id": f"client-{i}",
            "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
            "scopes": ["read"],
            "collections": [args.collection],
            # The last of several clients runs under a rate limit; a lone client never does.
            **({"requests_per_minute": LIMITED_RATE} if i == args.clients - 1 > 0 else {}),
        }
        for i, key in enumerate(keys)
    ]
    with tempfile.TemporaryDirectory() as folder:
        auth = Path(folder) / "principals.json"
        auth.write_text(json.dumps({"principals": principals}))
        env = {
            **os.environ,
            "MCP_TRANSPORT": "http",
            "MCP_SERVER_PORT": "0",
            "RAG_AUTH_FILE": str(auth),
            "RAG_DATA_DIR": str(args.data_dir.resolve()),
            "RAG_TECHNIQUES": args.techniques,
            "IRIS_RAG_PYTHON": os.environ.get("IRIS_RAG_PYTHON", sys.executable),
        }
        process, url = start_server(env)
        try:
            # Warm: the model loads and the collection's vectors come into memory before the clock runs.
            warm = argparse.Namespace(**{**vars(args), "seconds": 5})
            asyncio.run(run(url, keys[:2], warm, queries))
            result = {
                "machine": machine(),
                "techniques": args.techniques,
                **asyncio.run(run(url, keys, args, queries)),
            }
        finally:
            process.terminate()
            process.wait(30)
    write(args.out, result)


if __name__ == "__main__":
    main()

"""Same-run A/B of whole technique calls: one worker per source tree, the same calls to each in turn.

Each variant is a checkout of iris_rag (`NAME=DIR`, e.g. `git archive` of an older commit unpacked in
/tmp, or `.` for this tree), run as its own worker (`python -m iris_rag.bridge` with PYTHONPATH=DIR) on
the same store. Every query goes to every variant in turn, the order rotating from query to query, so the
drift of a shared machine hits every variant alike; the round trip over the bridge's pipes is timed. The
ratios are medians of per-query ratios to the first variant. The rankings are compared too.
Each technique gets the query with its own number of trailing spaces, which the tokenizer drops: the same
vector, but not the one an earlier technique's call left in the worker's memory of recent queries.

    .venv/bin/python -m bench.ab_workers --data-dir DIR --collection NAME \\
        --variant before=/tmp/lat2_head --variant after=. --techniques graphrag,hyde --top-k 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import SCIFACT, add_query_options, machine, percentiles, read_jsonl, write


class Worker:
    """A worker process from one source tree, answering JSON lines."""

    def __init__(self, source: Path, data_dir: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": str(source.resolve()),
            "RAG_DATA_DIR": str(data_dir),
            "LOG_LEVEL": "WARNING",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "iris_rag.bridge"],
            cwd=source,  # -m puts the working directory first on sys.path, before PYTHONPATH
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.next_id = 0

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """One request's result (progress events skipped); an AssertionError when it failed."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        self.process.stdin.write(orjson.dumps(message) + b"\n")
        self.process.stdin.flush()
        while True:
            response = orjson.loads(self.process.stdout.readline())
            if response.get("id") == self.next_id and "event" not in response:
                assert response["success"], response
                return response["result"]

    def close(self) -> None:
        """Stop the worker."""
        self.process.kill()
        self.process.wait()


def main() -> None:
    """Time every (technique, variant) per query, in rotating order; print percentiles and ratios."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--variant", action="append", required=True, help="NAME=SOURCE_DIR (repeatable)")
    parser.add_argument("--techniques", default="graphrag")
    add_query_options(parser, queries=SCIFACT / "queries.jsonl", queries_limit=100, warmup=5, top_k=5)
    parser.add_argument("--generate", action=argparse.BooleanOptionalAction, default=False)
    args = parser.parse_args()

    variants = {name: Path(path) for name, _, path in (v.partition("=") for v in args.variant)}
    techniques = [t.strip() for t in args.techniques.split(",") if t.strip()]
    queries = [q["text"] for q in read_jsonl(args.queries, args.queries_limit)]
    workers = {name: Worker(path, args.data_dir) for name, path in variants.items()}
    names = list(workers)
    times: dict[str, dict[str, list[float]]] = {t: {n: [] for n in names} for t in techniques}
    same_ranking = {t: 0 for t in techniques}
    try:
        for worker in workers.values():
            worker.call("describe", {})
        for i, query in enumerate(queries[: args.warmup] + queries):
            for t, technique in enumerate(techniques):
                arguments = {
                    # Trailing spaces (the tokenizer drops them): each technique's own query text, so that
                    # none finds the query vector another technique's call left remembered in the worker.
                    "query": query + " " * t,
                    "collection_id": args.collection,
                    "options": {"top_k": args.top_k, "generate": args.generate},
                }
                rankings = {}
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order:
                    started = time.perf_counter()
                    result = workers[name].call("execute", {"technique": technique, "arguments": arguments})
                    elapsed = (time.perf_counter() - started) * 1000
                    rankings[name] = [d["chunk_id"] for d in result["retrieved_documents"]]
                    if i >= args.warmup:
                        times[technique][name].append(elapsed)
                if i >= args.warmup and len({tuple(r) for r in rankings.values()}) == 1:
                    same_ranking[technique] += 1
    finally:
        for worker in workers.values():
            worker.close()

    report: dict[str, Any] = {}
    for technique in techniques:
        base = times[technique][names[0]]
        report[technique] = {
            "latency_ms": {name: percentiles(samples) for name, samples in times[technique].items()},
            "paired_ratio_to_" + names[0]: {
                name: round(statistics.median(s / b for s, b in zip(samples, base, strict=True)), 3)
                for name, samples in times[technique].items()
            },
            "same_ranking_queries": same_ranking[technique],
        }
    write(
        args.out,
        {
            "benchmark": f"same-run A/B over the bridge (ms, top_k {args.top_k}, generate {args.generate})",
            "collection": args.collection,
            "variants": {name: str(path) for name, path in variants.items()},
            "queries": len(queries),
            "techniques": report,
            "machine": machine(),
        },
    )


if __name__ == "__main__":
    main()

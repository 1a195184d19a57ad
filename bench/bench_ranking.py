"""4R ranking (options.ranking) on the bundled SciFact sample: what it costs, and what it does to the ranking.

Ingests samples/scifact (300 abstracts, 60 queries with their relevant papers) into a fresh folder with
rag_basic only, then for every query calls rag_basic (generation off, top_k 10) three ways, in rotating
order so that the machine's load falls on each alike:
  plain      no options.ranking (today's result),
  identity   ranking {} (relevancy alone: must give the same documents, with the wider pool's cost),
  richness   ranking {"relevancy": 0.7, "richness": 0.3}.
Prints the median call time of each and the median per-query ratio to plain, and nDCG@10 (binary
relevance, by document) of each. The sample has no dates or reputation fields, so recency and reputation
are not measured on it (tests/test_ranking.py checks that they reorder).

    .venv/bin/python -m bench.bench_ranking [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import SAMPLE, machine, median, read_jsonl, write
from iris_rag.service import RagService
from iris_rag.settings import Settings

CONFIGS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "identity": {},
    "richness": {"relevancy": 0.7, "richness": 0.3},
}
TOP_K = 10


def ndcg(ranked: list[str], relevant: set[str], k: int = TOP_K) -> float:
    """nDCG@k with binary relevance, each document counted once."""
    seen: list[str] = []
    for document in ranked:
        if document not in seen:
            seen.append(document)
    gain = sum(1 / math.log2(i + 2) for i, d in enumerate(seen[:k]) if d in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return gain / ideal if ideal else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2, help="passes over the 60 queries")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        service = RagService(Settings(RAG_DATA_DIR=Path(folder), RAG_TECHNIQUES="basic"))
        service.embedder.wait_ready()
        corpus = [
            {"id": row["_id"], "title": row.get("title", ""), "content": row["text"]}
            for row in read_jsonl(SAMPLE / "corpus.jsonl")
        ]
        service.ingest({"collection_id": "sample", "documents": corpus})
        queries = read_jsonl(SAMPLE / "queries.jsonl")

        def call(query: str, ranking: dict[str, Any] | None) -> tuple[float, list[str]]:
            options: dict[str, Any] = {"generate": False, "top_k": TOP_K}
            if ranking is not None:
                options["ranking"] = ranking
            arguments = {"query": query, "collection_id": "sample", "options": options}
            started = time.perf_counter()
            result = service.execute({"technique": "basic", "arguments": arguments})
            elapsed = (time.perf_counter() - started) * 1000
            return elapsed, [d["id"] for d in result["retrieved_documents"]]

        for row in queries[:5]:  # warm the model and the store
            call(row["text"], None)
        times: dict[str, list[float]] = {name: [] for name in CONFIGS}
        ratios: dict[str, list[float]] = {name: [] for name in CONFIGS if name != "plain"}
        quality: dict[str, list[float]] = {name: [] for name in CONFIGS}
        same_as_plain = 0
        names = list(CONFIGS)
        for round_number in range(args.rounds):
            for position, row in enumerate(queries):
                shift = (position + round_number) % len(names)
                order = names[shift:] + names[:shift]
                this: dict[str, tuple[float, list[str]]] = {
                    name: call(row["text"], CONFIGS[name]) for name in order
                }
                for name, (elapsed, _) in this.items():
                    times[name].append(elapsed)
                for name in ratios:
                    ratios[name].append(this[name][0] / this["plain"][0])
                if round_number == 0:
                    for name, (_, ranked) in this.items():
                        quality[name].append(ndcg(ranked, set(row["relevant"])))
                    same_as_plain += this["identity"][1] == this["plain"][1]
        service.close()

    result: dict[str, Any] = {
        "machine": machine(),
        "command": "python -m bench.bench_ranking " + f"--rounds {args.rounds}",
        "queries": len(queries),
        "top_k": TOP_K,
        "configs": CONFIGS,
        "median_ms": {name: median(values) for name, values in times.items()},
        "median_ratio_to_plain": {name: median(values) for name, values in ratios.items()},
        "ndcg_at_10": {name: round(statistics.mean(values), 4) for name, values in quality.items()},
        "identity_same_documents_as_plain": f"{same_as_plain}/{len(queries)}",
    }
    write(args.out, result)


if __name__ == "__main__":
    main()

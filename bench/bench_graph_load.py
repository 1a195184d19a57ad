"""Loading rag_graphrag's entity table whole: what a process's first call, or the first after a rewrite, pays.

In process on an existing collection with a knowledge graph: `--rounds` loads of the collection's entity
table (every entity with its counts and, for those it compares by embedding, its name vector; the aliases),
each from the store, nothing cached between them. Printed: median and worst seconds, and the table's size.

    RAG_DATA_DIR=/tmp/nr RAG_TECHNIQUES=hybrid_ifind,graphrag .venv/bin/python -m bench.bench_graph_load \
        --collection eval-scifact [--rounds 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import machine
from iris_rag.runtime import limit_blas_threads
from iris_rag.service import RagService
from iris_rag.settings import Settings
from iris_rag.techniques.graphrag.index import KnowledgeGraphIndex


def measure(collection: str, rounds: int) -> dict[str, Any]:
    service = RagService(Settings())
    index = service.pipelines["graphrag"].technique_index()
    assert isinstance(index, KnowledgeGraphIndex)
    index._load_entities(collection)  # warm the page cache: every round reads the same pages
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        table = index._load_entities(collection)
        seconds.append(time.perf_counter() - start)
    report = {
        "machine": machine(),
        "collection": collection,
        "entities": len(table.rows),
        "names_embedded": len(table.vector_rows),
        "rounds": rounds,
        "load_s_median": round(statistics.median(seconds), 4),
        "load_s_worst": round(max(seconds), 4),
    }
    service.close()
    return report


def main() -> None:
    limit_blas_threads()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collection", default="eval-scifact")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = measure(args.collection, args.rounds)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

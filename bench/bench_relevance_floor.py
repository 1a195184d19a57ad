"""Where "nothing relevant was found" should start: the best passage's query similarity, by kind of question.

Reads a collection already ingested (the bundled sample: `iris-rag ingest samples/scifact/corpus.jsonl
--collection scifact-sample`) and prints, for three kinds of question, percentiles of the cosine similarity
between the question and its best passage (all-MiniLM-L6-v2, exact search):
  answerable    the sample's own queries (their papers are in the sample),
  topical       SciFact train questions whose papers are not in the sample (same field, no answer there),
  off-topic     everyday questions nothing in a biomedical collection answers.
The extractive answer says nothing relevant was found below generation.RELEVANCE_FLOOR. `--technique`:
the similarity a technique's call judges (metadata.relevance, its top_k 5 results) instead of the exact
search's best chunk (the technique's index rows the collection lacks are built first, and waited for).

    .venv/bin/python -m bench.bench_relevance_floor --data-dir DIR --collection scifact-sample \\
        --scifact ../shared/data/scifact [--technique noderag] [--out FILE]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import SAMPLE, machine, read_jsonl, write
from iris_rag.generation import RELEVANCE_FLOOR
from iris_rag.service import RagService
from iris_rag.settings import Settings

OFF_TOPIC = [
    "What is the capital of France?",
    "How do I bake sourdough bread at home?",
    "Who won the football world cup in 2018?",
    "How to change a car tyre",
    "Best hiking trails in the Alps",
    "What is the price of bitcoin today?",
    "How do I install Python on Windows?",
    "Recipe for chocolate chip cookies",
    "When was the Eiffel Tower built?",
    "How to learn to play the guitar",
    "What time is sunset in Paris",
    "Explain the rules of chess",
    "Which programming language is fastest?",
    "How tall is Mount Everest?",
    "What is a good name for a cat?",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--collection", default="scifact-sample")
    parser.add_argument("--scifact", type=Path, required=True, help="BEIR SciFact folder (train split used)")
    parser.add_argument("--technique", help="judge through this technique's calls (default: exact search)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    techniques = "basic" if args.technique is None else args.technique
    # The background builder builds the technique's index rows the collection lacks (ingested without it),
    # waited for below: a technique refuses, or answers from part of the collection, until they are built.
    settings = Settings(
        RAG_DATA_DIR=args.data_dir, RAG_TECHNIQUES=techniques, LLM_PROVIDER="none", INDEX_BUILD="background"
    )
    service = RagService(settings, index_scan=[args.collection])
    try:
        groups = _judge(service, args)
    finally:
        service.close()
    result: dict[str, Any] = {
        "machine": machine(),
        "floor": RELEVANCE_FLOOR,
        "technique": args.technique,
        "groups": {},
    }
    print(f"{'questions':<12} {'n':>4} {'p1':>6} {'p5':>6} {'p50':>6} {'p95':>6} {'below floor':>12}")
    for name, scores in groups.items():
        values = np.array(scores)
        p1, p5, p50, p95 = (float(x) for x in np.percentile(values, [1, 5, 50, 95]))
        below = float(np.mean(values < RELEVANCE_FLOOR))
        result["groups"][name] = {
            "n": len(scores),
            "p1": p1,
            "p5": p5,
            "p50": p50,
            "p95": p95,
            "below": below,
        }
        print(f"{name:<12} {len(scores):>4} {p1:6.3f} {p5:6.3f} {p50:6.3f} {p95:6.3f} {below:12.1%}")
    write(args.out, result)


def _judge(service: RagService, args: argparse.Namespace) -> dict[str, list[float]]:
    """Each kind of question's best-passage similarities (exact search, or the technique's calls)."""
    service.embedder.wait_ready()
    service.wait_for_indexes(args.collection)

    def best(question: str) -> float:
        if args.technique is not None:
            arguments = {"query": question, "collection_id": args.collection}
            result = service.execute({"technique": args.technique, "arguments": arguments})
            return float(result["metadata"]["relevance"]["best_query_similarity"])
        hits = service.store.vector_search(args.collection, service.embedder.encode_query(question), 1)
        return hits[0].score

    in_sample = {row["_id"] for row in read_jsonl(SAMPLE / "corpus.jsonl")}
    relevant: dict[str, set[str]] = {}
    with (args.scifact / "qrels" / "train.tsv").open() as qrels:
        for row in csv.DictReader(qrels, delimiter="\t"):
            relevant.setdefault(row["query-id"], set()).add(row["corpus-id"])
    train = {row["_id"]: row["text"] for row in read_jsonl(args.scifact / "queries_train.jsonl")}
    return {
        "answerable": [best(row["text"]) for row in read_jsonl(SAMPLE / "queries.jsonl")],
        "topical": [
            best(train[q]) for q, papers in relevant.items() if q in train and not papers & in_sample
        ],
        "off-topic": [best(question) for question in OFF_TOPIC],
    }


if __name__ == "__main__":
    main()

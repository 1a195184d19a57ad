"""Rebuild samples/scifact/ from BEIR SciFact.

It keeps the documents judged relevant to the first test queries, plus an even sample of the
rest, so the bundled demo has real answers and real distractors.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path


def main() -> None:
    """Write corpus.jsonl and queries.jsonl under the output folder."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scifact", type=Path, default=Path("../shared/data/scifact"))
    parser.add_argument("--out", type=Path, default=Path("samples/scifact"))
    parser.add_argument(
        "--queries", type=int, default=60, help="test queries whose relevant documents are kept"
    )
    parser.add_argument("--documents", type=int, default=300)
    args = parser.parse_args()

    corpus = [json.loads(line) for line in (args.scifact / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line) for line in (args.scifact / "queries.jsonl").open(encoding="utf-8")]
    with (args.scifact / "qrels" / "test.tsv").open(encoding="utf-8") as handle:
        qrels = [row for row in csv.DictReader(handle, delimiter="\t")]
    chosen_queries = queries[: args.queries]
    chosen_ids = {q["_id"] for q in chosen_queries}
    keep = {row["corpus-id"] for row in qrels if row["query-id"] in chosen_ids}
    rest = [d["_id"] for d in corpus if d["_id"] not in keep]
    keep |= set(random.Random(13).sample(rest, args.documents - len(keep)))

    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "corpus.jsonl").open("w", encoding="utf-8") as out:
        for document in corpus:
            if document["_id"] in keep:
                out.write(json.dumps(document, ensure_ascii=False) + "\n")
    relevant: dict[str, list[str]] = {row["query-id"]: [] for row in qrels}
    for row in qrels:
        relevant[row["query-id"]].append(row["corpus-id"])
    with (args.out / "queries.jsonl").open("w", encoding="utf-8") as out:
        for query in chosen_queries:
            record = {"_id": query["_id"], "text": query["text"], "relevant": relevant[query["_id"]]}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
